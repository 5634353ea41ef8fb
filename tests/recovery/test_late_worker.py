"""A worker that starts late, in a cluster started by hand as on separate hosts: the others
wait for it, and every update still averages one gradient of each worker."""

from __future__ import annotations

from procs import processes_mentioning, read_json
from sync_mnist.core.cluster import free_ports

STEPS = 30
BOUND = 180  # seconds a whole small cluster run may take on a loaded 2-core machine
COMMON = ("--dataset", "synthetic", "--train-steps", str(STEPS), "--timeout", "60",
          "--log-every", "10")


def test_tasks_by_hand_with_two_ps_and_a_late_worker_stay_in_lockstep(processes, tmp_path):
    # By hand, as on separate hosts: no launcher. Two ps tasks, so the model is split over
    # them (tests/inprocess/test_model.py checks the split) and each must drain its own done-queue.
    marker = str(tmp_path / "data")  # in every task's command line, to find leftovers
    ports = free_ports(5)
    hosts = ("--ps-hosts", ",".join(f"localhost:{p}" for p in ports[:2]),
             "--worker-hosts", ",".join(f"localhost:{p}" for p in ports[2:]))
    tasks = {}
    for role, index in (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)):
        tasks[role, index] = processes.task(
            role, index, *hosts, *COMMON, "--data-dir", marker,
            "--summary-json", str(tmp_path / f"{role}{index}.json"))
    # Worker 2 joins only after the chief has started training: the others must wait for it.
    tasks["worker", 0].wait_for_line(r"\[worker 0\] ready after", BOUND)
    tasks["worker", 2] = processes.task(
        "worker", 2, *hosts, *COMMON, "--data-dir", marker,
        "--summary-json", str(tmp_path / "worker2.json"))

    for (role, index), proc in tasks.items():
        assert proc.wait(BOUND) == 0, proc.output
    workers = [read_json(tmp_path / f"worker{i}.json") for i in range(3)]
    for w in workers:
        # Each of the 30 updates averaged one gradient of each worker: counted on the ps, and
        # by the workers.
        assert w["global_step"] == STEPS
        assert w["contributions"] == w["pushed"] == [STEPS] * 3
        assert w["dropped"] == [0, 0, 0] and w["solo_updates"] == 0
        assert w["local_steps"] == STEPS
        assert w["synchronous"] is True
    # The others really waited: the chief was ready to train (and pushed its first gradient)
    # before worker 2 was even started, yet worker 2 found the cluster at global_step 0, and
    # the chief's last step came after worker 2 was ready. Had the others trained without it,
    # worker 2 would have joined at a later step (or after the end).
    assert workers[0]["ready_at"] < workers[2]["ready_at"]  # the premise, as started above
    assert workers[2]["start_step"] == 0 and not workers[2]["rejoined"]
    assert workers[0]["finished_at"] > workers[2]["ready_at"]
    # Both ps tasks drained their done-queues and exited by themselves, having read the same
    # final counters.
    for index in (0, 1):
        ps = read_json(tmp_path / f"ps{index}.json")
        assert (ps["exit_code"], ps["blocked"]) == (0, False)
        assert (ps["global_step"], ps["contributions"]) == (STEPS, [STEPS] * 3)
    assert processes_mentioning(marker) == []
