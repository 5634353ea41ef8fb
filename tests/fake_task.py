"""A stand-in for `python -m sync_mnist` in launcher tests: no TensorFlow, no server.

    fake_task.py BEHAVIOUR DIR --role R --index I ... --summary-json PATH

Every task but the chief waits (bounded) until the chief has started, as real ones do, so the
launcher goes through its whole start order. The chief marks its start with a file in DIR.
BEHAVIOUR:
  hanging-ps       the workers finish, synchronous, and exit 0; the ps never exits.
  not-synchronous  every task ends by itself; the workers' records say "not synchronous"
                   and they exit 3, as real workers of the question's replay do.
  bad-input-chief  the chief rejects its input as a real one does (one `error:` line, a
                   record with the error, exit 2); the other tasks wait to be stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sync_mnist import config as config_lib
from sync_mnist import report

START_SECS = 30.0  # a bare Python start-up, bounded generously for a loaded machine
BAD_INPUT = "--logdir /nowhere/logdir is not writable: Permission denied"  # bad-input-chief's


def main() -> int:
    behaviour, marks = sys.argv[1], Path(sys.argv[2])
    parser = argparse.ArgumentParser()
    parser.add_argument("--role")
    parser.add_argument("--index", type=int)
    parser.add_argument("--worker-hosts")
    parser.add_argument("--summary-json", type=Path)
    args, _ = parser.parse_known_args(sys.argv[3:])
    workers = len(args.worker_hosts.split(","))
    chief_started = marks / "chief-started"
    if args.role == "worker" and args.index == 0:
        chief_started.touch()
        if behaviour == "bad-input-chief":
            print(f"error: {BAD_INPUT}", flush=True)
            result = report.TaskResult(role="worker", index=0, mode="sync", error=BAD_INPUT,
                                       exit_code=config_lib.EXIT_USAGE)
            result.write_json(args.summary_json)
            return config_lib.EXIT_USAGE
    else:
        if args.role == "worker":
            print(f"[worker {args.index}] {report.WAITING_FOR_CHIEF}", flush=True)
        deadline = time.monotonic() + START_SECS
        while not chief_started.exists():
            if time.monotonic() > deadline:
                print(f"the chief did not start within {START_SECS:g} s", flush=True)
                return config_lib.EXIT_TIMEOUT
            time.sleep(0.05)
    while behaviour == "bad-input-chief":
        time.sleep(3600)  # until the launcher stops it
    if args.role == "ps":
        while behaviour == "hanging-ps":
            time.sleep(3600)  # until the launcher stops it
        return config_lib.EXIT_OK
    synchronous = behaviour != "not-synchronous"
    steps = 2
    # Not synchronous as in the question's replay: the chief gave every gradient.
    contributions = [steps] * workers if synchronous else \
        [steps * workers] + [0] * (workers - 1)
    result = report.TaskResult(
        role="worker", index=args.index, mode="sync", global_step=steps, target_steps=steps,
        local_steps=steps, replicas_to_aggregate=workers, contributions=contributions,
        pushed=list(contributions), dropped=[0] * workers, synchronous=synchronous,
        verdict="synchronous (fake)" if synchronous else "NOT synchronous (fake)",
        finished_at=time.time())
    result.exit_code = config_lib.EXIT_OK if synchronous else config_lib.EXIT_NOT_SYNCHRONOUS
    result.write_json(args.summary_json)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
