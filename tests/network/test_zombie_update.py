"""A chief killed while its update step waits on two ps, one or both of them not told of its
death, and restarted: no part of the old chief's update takes the gradients of the new one's
(issue 56, item 1: the zombie update).

On the testbed (lab/testbed.py), 2 ps and 3 workers. The chief's model (held_chief_model.py)
holds it once before its step 21: its update step for update 21 is then waiting on both ps,
its own gradient unpushed. The switch drops every frame between the chief and the ps not to be
told, and every later frame of the connections the chief's update steps came by (a ps learns
of a dead client on them alone); then the chief is killed. A ps still reachable learns of it
at once, and ends its part of the old update. The chief's link heals and it is started again,
as a launcher or a pod would. Before sync._witnesses, the part on ps 1, not told when ps 0 was,
took update 21's gradients from the replacement and the run ended exit 200 ("every worker
pushed for update 21 but no update came"), every time. With neither told, the old update takes
them whole and makes update 21. Root only; skips, saying why, elsewhere. `make test-network`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import lan_cluster
from procs import processes_mentioning

TIMEOUT = 12
STEPS = 40
START_BOUND = 120
MODEL = Path(__file__).parent.parent / "held_chief_model.py"


def lan_port(run: lan_cluster.LanCluster, ps: int) -> int:
    """The port ps `ps` serves on."""
    argv = run.argv["ps", ps]
    return int(argv[argv.index("--ps-hosts") + 1].split(",")[ps].rsplit(":", 1)[1])


@pytest.fixture
def lan():
    yield from lan_cluster.lan_fixture(num_ps=2, num_workers=3)


@pytest.mark.parametrize("untold", [(0,), (1,), (0, 1)],
                         ids=["ps 0 not told", "ps 1 not told", "neither told"])
def test_a_chief_killed_unheard_by_one_ps_and_restarted_leaves_no_zombie_update(
        untold, lan, processes, tmp_path):
    flag = tmp_path / "hold"
    flag.touch()
    run = lan_cluster.start(lan, processes, tmp_path, "--timeout", str(TIMEOUT),
                            "--train-steps", str(STEPS), "--model", f"{MODEL}:MODEL",
                            env={"HELD_CHIEF_FLAG": str(flag)})
    chief = run.procs["worker", 0]
    held = Path(f"{flag}.held")
    deadline = time.monotonic() + START_BOUND
    while not held.exists():
        assert time.monotonic() < deadline and chief.popen.poll() is None, run.tails(8)
        time.sleep(0.1)
    for ps in untold:
        lan.partition_from(("worker", 0), ("ps", ps))
    for ps in untold:  # its server's connections from the chief: the old update step's
        assert lan.drop_flows(("ps", ps), ("worker", 0), local_port=lan_port(run, ps)) > 0
    os.kill(chief.popen.pid, signal.SIGKILL)
    chief.wait(10)
    assert lan.dropped("worker", 0) > 0  # the frames that would have told the ps
    lan.heal("worker", 0)
    run.restart("worker", 0)
    ended = run.ended_by(time.monotonic() + START_BOUND + TIMEOUT)

    assert {t: e[0] for t, e in ended.items()} == {t: 0 for t in run.procs}, (
        run.describe(ended, 0), run.tails(8))
    record = run.record("worker", 1)
    assert record["synchronous"] is True and record["contributions"] == [STEPS] * 3, record
    assert processes_mentioning(str(tmp_path / "data")) == []
