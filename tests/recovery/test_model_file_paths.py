"""One model file at two paths is one model (issue 45): each worker is given the same file
where its own host keeps it, and the cluster trains it verified, as one model.

tests/fast/test_membership.py shows the settings agree; this run shows nothing else in a task
goes by the path. The model file is the documented example (examples/your_model/my_model.py).
"""

from __future__ import annotations

import shutil

from procs import YOUR_MODEL, processes_mentioning, read_json
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_OK

BOUND = 240  # seconds a small cluster run may take on a loaded 2-core machine


def test_one_model_file_at_two_paths_trains_verified_as_one_model(processes, tmp_path):
    paths = [tmp_path / "host_a" / "models" / "my_model.py", tmp_path / "host_b" / "m.py"]
    for path in paths:
        path.parent.mkdir(parents=True)
        shutil.copy(YOUR_MODEL, path)
    ports, steps = free_ports(3), 30
    hosts = ["--ps-hosts", f"127.0.0.1:{ports[0]}", "--worker-hosts",
             f"127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}", "--train-steps", str(steps),
             "--timeout", "60"]
    # ps 0 and worker 0 on host A, worker 1 on host B.
    tasks = [processes.task(role, index, *hosts, "--model", f"{paths[host]}:MODEL",
                            "--summary-json", str(tmp_path / f"{role}{index}.json"))
             for role, index, host in (("ps", 0, 0), ("worker", 0, 0), ("worker", 1, 1))]
    for task in reversed(tasks):  # worker 1 first: a path compared is its exit 2, at once
        assert task.wait(BOUND) == EXIT_OK, task.output[-5000:]
    for index in range(2):
        record = read_json(tmp_path / f"worker{index}.json")
        assert record["synchronous"] is True, record["verdict"]
        assert record["contributions"] == [steps, steps]
    assert processes_mentioning(str(tmp_path)) == []
