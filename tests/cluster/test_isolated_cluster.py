"""The launcher's private network namespace, with whole clusters (issue 4, Security).

From outside the namespace while the cluster trains, its ports cannot be reached: the shared
fixed run (conftest.py), probed while it trained. With `--isolate off` they can, and where no
namespace can be made the launcher says so once and goes on: those two runs are in
tests/network/test_isolation_options.py (`make test-network`). The namespace on its own, and
the launcher's option, are checked in tests/fast/test_netns.py.
"""

from __future__ import annotations

import pytest


def test_isolated_cluster_is_unreachable_from_outside_and_trains_in_lockstep(fixed_run):
    # The shared run (conftest.py) is the launcher's default, in a private namespace where
    # one can be made, probed from outside while it trained.
    if not fixed_run.isolated:
        pytest.skip(f"no network namespace can be made here: {fixed_run.why_not_isolated}")
    assert fixed_run.ports == list(range(fixed_run.base, fixed_run.base + 4))  # as asked
    assert sorted(fixed_run.task_inodes) == ["ps 0", "worker 0", "worker 1", "worker 2"]
    inodes = set(fixed_run.task_inodes.values())
    assert len(inodes) == 1 and fixed_run.own_inode not in inodes  # one namespace, not ours
    assert fixed_run.interfaces == ["lo"]  # no way in from any other host
    assert set(fixed_run.ports) <= fixed_run.listening  # the servers really were up, inside
    assert all(r.keys() == {"127.0.0.1", "::1"} for r in fixed_run.refused.values()), \
        fixed_run.refused
    assert fixed_run.code == 0, fixed_run.output
    assert fixed_run.summary["synchronous"] is True
    assert "private network namespace with loopback only" in fixed_run.output
    assert fixed_run.leftovers == []
