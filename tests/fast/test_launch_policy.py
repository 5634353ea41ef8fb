"""The launcher's supervision policy, with stand-in tasks and no process: which dead task it
restarts within --max-restarts, which endings are final, and which workers it goes on without.

The launcher with real processes is in tests/cluster/test_launch.py.
"""

from __future__ import annotations

import collections
import time

from sync_mnist.core.config import EXIT_FAILED, EXIT_PEER_LOST, EXIT_TIMEOUT, EXIT_USAGE
from sync_mnist.task.report import TaskResult
from sync_mnist.task.report import replacements_wanted as from_line


class _FakeTask:
    """Stands in for launch._Task: each start exits with the next code of `codes`."""

    def __init__(self, role, index, *codes, error=None, missing=None, done_reported=None):
        self.role, self.index, self.tag = role, index, f"{role} {index}"
        self.done_reported, self.missing = done_reported, missing
        self.codes, self.starts, self.lost, self.spent = list(codes), 1, False, False
        self.spawned, self.progressed, self.ended = time.monotonic() - 1.0, None, None
        self.restarted, self.error = None, error
        self.verdict_at, self.up, self.restarts, self.ready = None, False, 0, False
        self.killed = 0
        self.replacements = collections.deque()  # what it said its update waits for

    def started_up(self):
        return self.up

    def kill(self):
        self.killed += 1

    def poll(self):
        return self.codes[self.starts - 1]

    def restart(self):
        self.starts += 1
        self.restarted = self.spawned = time.monotonic()

    def result(self):
        return TaskResult(role=self.role, index=self.index, mode="sync", error=self.error,
                          missing=self.missing, done_reported=self.done_reported)

    def last_sign_of_life(self):
        return time.monotonic()


def _wait(tasks, max_restarts=0, spare_workers=0, **bounds):
    from sync_mnist.launcher import launch

    # The launcher's restart policy and wait loop, private to it, driven here with fake tasks.
    policy = launch._Policy(tasks, max_restarts=max_restarts, spare_workers=spare_workers,
                            timeout=10.0)
    return launch._wait(tasks, policy, ps_serve_forever=False, **bounds)


def test_launcher_restarts_dead_tasks_within_its_budget_and_never_bad_input():
    # The chief still runs: a ps that dies once a worker has ended 0 is not restarted.
    ps, chief, worker = (_FakeTask("ps", 0, -9, 0), _FakeTask("worker", 0, None),
                         _FakeTask("worker", 1, -9, EXIT_FAILED, 0))
    # Three deaths, two restarts allowed: the third stops the cluster.
    assert _wait([ps, chief, worker], max_restarts=2) is worker
    assert (ps.starts, worker.starts) == (2, 2)
    # Exit 2 (bad input) and 3 (not synchronous) are final: a restart would not mend them.
    bad = _FakeTask("worker", 1, EXIT_USAGE, 0)
    assert _wait([bad], max_restarts=5) is bad
    assert bad.starts == 1
    # Nor a task that failed after its done report (found by make chaos: the chief's SavedModel
    # failed on a full disk, exit 1; its replacement waited for the ps that had ended, until
    # the launcher's end bound turned the run's 1 into 200).
    ps, chief = _FakeTask("ps", 0, 0), _FakeTask("worker", 0, EXIT_FAILED, 0,
                                                     done_reported=True)
    assert _wait([ps, chief], max_restarts=1) is chief
    assert chief.starts == 1


def _policy(tasks, max_restarts=0, spare_workers=0):
    from sync_mnist.launcher import launch

    return launch._Policy(tasks, max_restarts=max_restarts, spare_workers=spare_workers,
                          timeout=10.0)


_MISSING_1 = ("worker {}: waited 10 s for an update after local step 5; contributions so far "
              "[5, 5, 5]; missing: worker 1 (no gradient for update 6)")


def test_one_fault_costs_one_restart_whoever_timed_out_waiting_for_it():
    # Issue 35: worker 1 died (or froze) and was restarted; the chief and worker 2, started
    # before that, timed out waiting for it. --max-restarts 1 mends the one fault.
    dead = _FakeTask("worker", 1, -9, None)
    chief = _FakeTask("worker", 0, EXIT_TIMEOUT, None, error=_MISSING_1.format(0),
                      missing=["worker 1"])
    other = _FakeTask("worker", 2, EXIT_TIMEOUT, EXIT_TIMEOUT, error=_MISSING_1.format(2),
                      missing=["worker 1"])
    policy = _policy([dead, chief, other], max_restarts=1)
    assert policy.after_exit(dead, -9)
    assert policy.after_exit(other, EXIT_TIMEOUT) and policy.after_exit(chief, EXIT_TIMEOUT)
    assert (dead.starts, chief.starts, other.starts) == (2, 2, 2)
    # A timeout of a process started after that restart is a new fault: none is left for it.
    assert not policy.after_exit(other, EXIT_TIMEOUT)
    assert other.starts == 2
    # A timeout that names no restarted peer is charged as before.
    alone = _FakeTask("worker", 2, EXIT_TIMEOUT, error=_MISSING_1.format(2),
                      missing=["worker 1"])
    assert not _policy([_FakeTask("worker", 1, None), alone], max_restarts=0).after_exit(
        alone, EXIT_TIMEOUT)


# The same timeout in other words, or in none: the record's `missing` field, not the message,
# says whom the task waited for.
_REWORDED = ("worker {}: gave up after 10 s: worker 1 sent no gradient for update 6",
             "worker {}: timed out", None)


def test_a_reworded_message_does_not_change_whom_the_launcher_restarts():
    def decide(error, missing):
        """Worker 1, frozen past its start-up, held up worker 2, which timed out naming it."""
        frozen = _FakeTask("worker", 1, None, 0)
        frozen.up = True
        timed_out = _FakeTask("worker", 2, EXIT_TIMEOUT, 0, error=error, missing=missing)
        policy = _policy([frozen, timed_out], max_restarts=1)
        assert policy.after_exit(timed_out, EXIT_TIMEOUT)
        return frozen.killed, frozen.starts, timed_out.starts, policy._made

    # The frozen peer is killed and restarted (the one fault), the task that waited for it
    # restarted at no charge.
    assert decide(_MISSING_1.format(2), ["worker 1"]) == (1, 2, 2, 1)
    for error in _REWORDED:
        assert decide(error and error.format(2), ["worker 1"]) == (1, 2, 2, 1), error
    # A message that names the peer while the field is empty restarts nobody but the task
    # itself (its own fault, charged): the words are not read.
    for missing in (None, []):
        assert decide(_MISSING_1.format(2), missing) == (0, 1, 2, 1), missing


def test_a_reworded_message_does_not_change_which_timeout_is_part_of_a_mended_fault():
    def decide(error, missing):
        """Worker 1 died and was restarted (the one fault); then the chief, started before,
        timed out waiting for it."""
        dead = _FakeTask("worker", 1, -9, None)
        chief = _FakeTask("worker", 0, EXIT_TIMEOUT, None, error=error, missing=missing)
        policy = _policy([dead, chief], max_restarts=1)
        assert policy.after_exit(dead, -9)
        return policy.after_exit(chief, EXIT_TIMEOUT), chief.starts

    assert decide(_MISSING_1.format(0), ["worker 1"]) == (True, 2)  # at no charge
    for error in _REWORDED:
        assert decide(error and error.format(0), ["worker 1"]) == (True, 2), error
    # Named in words only: a fault of its own, and none is left for it.
    assert decide(_MISSING_1.format(0), None) == (False, 1)


def test_the_launcher_reads_missing_from_the_record_the_task_wrote(tmp_path):
    from sync_mnist.launcher import launch

    TaskResult(role="worker", index=2, mode="sync", error="worker 2: timed out",
               missing=["worker 1", "ps 0"], exit_code=EXIT_TIMEOUT).write_json(
        tmp_path / "worker-2.json")
    task = launch._Task.__new__(launch._Task)  # its fields only: no process is started
    task.role, task.index, task.summary = "worker", 2, tmp_path / "worker-2.json"
    task.proc = type("Proc", (), {"returncode": EXIT_TIMEOUT})()
    task.restarts, task.lost, task.spent, task.overdue = 0, False, False, None
    task.stopped, task.spared = False, None
    assert launch._missing(task) == ["worker 1", "ps 0"]
    # A record with no such field (a task that wrote none, or an older one): nobody.
    task.summary = tmp_path / "none.json"
    assert launch._missing(task) == []


def test_the_workers_that_lost_a_restarted_ps_in_their_finish_are_part_of_its_fault():
    # Found by killing the ps as the chief logged its last step (--max-restarts 1): worker 1,
    # then the chief, failed on the lost ps in the finish (201; a training step recovers from
    # it by itself), and the launcher stopped the cluster, its one restart spent on the ps.
    ps = _FakeTask("ps", 0, -9, None)
    chief, other = _FakeTask("worker", 0, EXIT_PEER_LOST, 0), _FakeTask("worker", 1,
                                                                        EXIT_PEER_LOST, 0)
    policy = _policy([ps, chief, other], max_restarts=1)
    assert policy.after_exit(ps, -9)
    assert policy.after_exit(other, EXIT_PEER_LOST) and policy.after_exit(chief, EXIT_PEER_LOST)
    assert (ps.starts, chief.starts, other.starts) == (2, 2, 2)
    # The same exit with no ps restarted since the task started is a fault of its own.
    alone = _FakeTask("worker", 1, EXIT_PEER_LOST, EXIT_PEER_LOST)
    policy = _policy([_FakeTask("ps", 0, None), alone], max_restarts=1)
    assert policy.after_exit(alone, EXIT_PEER_LOST) and alone.starts == 2
    assert not policy.after_exit(alone, EXIT_PEER_LOST)


def test_a_timeout_that_names_nobody_after_a_ps_restart_is_part_of_its_fault():
    # Found by make chaos-short (ps 0 of 2 frozen as the chief evaluated, --max-restarts 1):
    # worker 1 timed out naming ps 0, which the launcher restarted; the chief's timeout came
    # later, when the new ps 0 answered, and named nobody: the launcher, its restart spent,
    # stopped the cluster.
    frozen = _FakeTask("ps", 0, None, None)
    frozen.up = True  # past its start-up
    worker = _FakeTask("worker", 1, EXIT_TIMEOUT, None, missing=["ps 0"])
    chief = _FakeTask("worker", 0, EXIT_TIMEOUT, None, missing=None)
    policy = _policy([frozen, worker, chief], max_restarts=1)
    assert policy.after_exit(worker, EXIT_TIMEOUT) and policy.after_exit(chief, EXIT_TIMEOUT)
    assert (frozen.killed, frozen.starts, worker.starts, chief.starts) == (1, 2, 2, 2)
    assert policy._made == 1
    # A worker restarted is no ps: a timeout naming nobody after it is a fault of its own
    # (the chief above, with worker 1 in place of ps 0: see the reworded-message test).


def test_a_worker_that_dies_after_another_verified_the_run_does_not_stop_it():
    # Seen in the chaos soak (R = N, no restart): worker 1 was killed after worker 2 had
    # verified the final counters and ended 0, while the chief was still evaluating; the
    # launcher stopped the cluster and a verified run ended 1.
    chief, dead, verified = (_FakeTask("worker", 0, None), _FakeTask("worker", 1, -9),
                             _FakeTask("worker", 2, 0))
    policy = _policy([chief, dead, verified])
    assert policy.after_exit(dead, -9) and dead.spent and dead.starts == 1
    # Seen again: worker 2 had logged its verdict but not yet ended.
    dead, printed = _FakeTask("worker", 1, -9), _FakeTask("worker", 2, None)
    printed.verdict_at = time.monotonic()
    assert _policy([chief, dead, printed]).after_exit(dead, -9) and dead.spent
    # The chief is needed until it ends: its death still stops the cluster.
    chief = _FakeTask("worker", 0, -9)
    assert not _policy([chief, _FakeTask("worker", 1, None), verified]).after_exit(chief, -9)


def test_a_task_frozen_past_its_start_up_is_restarted_though_training_never_began():
    # Seen in the chaos soak (R = N, --max-restarts 1): worker 2, frozen after it said it waited
    # for the chief, held up update 1; with no progress line yet it was spared as "still
    # starting", worker 1 was restarted instead, and the chief's timeout then stopped the run.
    frozen = _FakeTask("worker", 2, None, 0)
    timed_out = _FakeTask("worker", 1, EXIT_TIMEOUT, 0, error=_MISSING_1.replace(
        "worker 1 (", "worker 2 (").format(1), missing=["worker 2"])
    policy = _policy([frozen, timed_out], max_restarts=1)
    assert policy._culprits(timed_out) == []  # still starting, as far as anyone knows
    frozen.up = True  # it said it waits for the chief
    assert policy._culprits(timed_out) == [frozen]
    assert policy.after_exit(timed_out, EXIT_TIMEOUT)
    assert (frozen.killed, frozen.starts, timed_out.starts) == (1, 2, 2)


def test_launcher_goes_on_without_a_dead_backup_worker_but_not_without_the_chief():
    chief, backup = _FakeTask("worker", 0, 0), _FakeTask("worker", 2, -9)
    assert _wait([chief, backup], spare_workers=1) is None
    assert backup.lost
    dead_chief = _FakeTask("worker", 0, -9)
    assert _wait([dead_chief], spare_workers=1) is dead_chief
    # With R = N there is no spare: a dead worker stops the cluster.
    again = _FakeTask("worker", 2, -9)
    assert _wait([again], spare_workers=0) is again


def test_a_backup_still_running_after_the_chief_verified_the_run_is_lost_not_overdue():
    # Seen in the chaos soak (R = 2 of 3, --max-restarts): a backup killed mid-run and
    # restarted, which the chief then declared lost, waited for a run that was over; at the
    # launcher's end bound it was counted overdue, and a verified run ended 200.
    chief, other = _FakeTask("worker", 0, 0), _FakeTask("worker", 2, 0)
    successor, ps = _FakeTask("worker", 1, None), _FakeTask("ps", 0, 0)
    tasks = [ps, chief, successor, other]
    for t in tasks:
        t.overdue = None
    assert _wait(tasks, max_restarts=3, spare_workers=1, end_bound=0.0) is None
    assert successor.lost and successor.overdue is None
    # With R = N there is no backup to spare: the same task is overdue.
    successor = _FakeTask("worker", 1, None)
    successor.overdue = None
    tasks = [ps, chief, successor, other]
    assert _wait(tasks, max_restarts=3, spare_workers=0, end_bound=0.0) is successor
    assert not successor.lost and "stopped by the launcher" in successor.overdue
    # Found by killing the ps as the chief evaluated (R = N, --max-restarts 1): worker 1 lost it
    # in its finish (201) and was restarted; the chief verified the run and ended 0, and the
    # replacement, which never joined, waited for it to initialise the model: a verified run
    # ended 200 at the end bound.
    # The ps, restarted too, waits for the done report the replacement will never send.
    replacement, waiting_ps = _FakeTask("worker", 1, None), _FakeTask("ps", 0, None)
    replacement.restarts = waiting_ps.restarts = 1
    tasks = [waiting_ps, chief, replacement]
    for t in tasks:
        t.overdue = None
    started = time.monotonic()
    assert _wait(tasks, max_restarts=1, end_bound=10.0) is None  # at once, not at the bound
    assert time.monotonic() - started < 5.0
    assert replacement.overdue is None and waiting_ps.overdue is None
    assert replacement.spent  # not a judge of the run: it has no verdict of its own
    replacement.spent = False
    # One that joined the run and still runs is stuck: overdue.
    replacement.ready = True
    assert _wait(tasks, max_restarts=1, end_bound=0.0) is not None
    assert "stopped by the launcher" in replacement.overdue


def test_a_ps_left_waiting_for_done_reports_after_a_verified_run_is_stopped_not_overdue():
    # Seen in the chaos soak (--max-restarts 3): ps 0 was stopped for 32 s at the end. Worker 1's
    # final reading timed out (exit 200, after the chief had verified the run and ended), the
    # chief gave up its done report, and ps 0, whose bound allows for restarts, waited on for
    # two reports that no one was left to send; at the end bound a verified run ended 200.
    ps, chief = _FakeTask("ps", 0, None), _FakeTask("worker", 0, 0)
    gave_up, other = _FakeTask("worker", 1, EXIT_TIMEOUT), _FakeTask("worker", 2, 0)
    tasks = [ps, chief, gave_up, other]
    for t in tasks:
        t.overdue = None
    assert _wait(tasks, max_restarts=3, spare_workers=0, end_bound=0.0) is None
    assert ps.overdue is None and gave_up.spent and gave_up.starts == 1
    # A ps that every worker reported done to, still running, is stuck: overdue.
    ps, reported = _FakeTask("ps", 0, None), _FakeTask("worker", 1, 0)
    tasks = [ps, chief, reported, other]
    for t in tasks:
        t.overdue = None
    assert _wait(tasks, max_restarts=3, spare_workers=0, end_bound=0.0) is ps
    assert "stopped by the launcher" in ps.overdue
    # Seen in the chaos soak: ps 0 killed after every worker's report and restarted; workers 1
    # and 2 had reported done to its predecessor and ended, so the new one waited for reports
    # that no one would send again, and a verified run ended 200 at the end bound.
    restarted = _FakeTask("ps", 0, None)
    ended_before = _FakeTask("worker", 1, 0), _FakeTask("worker", 2, 0)
    for worker in ended_before:
        worker.ended = restarted.spawned - 1.0
    tasks = [restarted, chief, *ended_before]
    for t in tasks:
        t.overdue = None
    assert _wait(tasks, max_restarts=3, spare_workers=0, end_bound=0.0) is None
    assert restarted.overdue is None
    # Found by killing the ps as worker 1 logged its verdict, the chief still evaluating: the
    # launcher restarted the ps before it noticed worker 1's end, so worker 1 seemed to have
    # ended after the new ps started; its verdict, logged after its done report, came before.
    restarted = _FakeTask("ps", 0, None)
    reported_first = _FakeTask("worker", 1, 0)
    reported_first.verdict_at, reported_first.ended = (restarted.spawned - 0.1,
                                                       restarted.spawned + 0.1)
    tasks = [restarted, chief, reported_first]
    for t in tasks:
        t.overdue = None
    assert _wait(tasks, max_restarts=3, spare_workers=0, end_bound=0.0) is None
    assert restarted.overdue is None
    # While a worker still runs, the ps may still be needed: both are overdue.
    still = _FakeTask("worker", 2, None)
    still.overdue = None
    tasks = [ps, chief, gave_up, still]
    assert _wait(tasks, max_restarts=3, spare_workers=0, end_bound=0.0) is ps
    assert "stopped by the launcher" in ps.overdue and "stopped by the launcher" in still.overdue


def test_a_ps_left_waiting_once_every_worker_ended_is_spared_without_waiting_out_the_bound():
    # Chaos run 19 on 7808e7d: worker 1, frozen past --timeout at the end, ended 200 after the
    # chief had verified the run; both ps waited for its done report until the launcher's
    # end bound (70 s), and a verified run took 82 s to end.
    ps0, ps1, chief = _FakeTask("ps", 0, None), _FakeTask("ps", 1, None), _FakeTask("worker", 0, 0)
    frozen, other = _FakeTask("worker", 1, EXIT_TIMEOUT), _FakeTask("worker", 2, 0)
    tasks = [ps0, ps1, chief, frozen, other]
    for t in tasks:
        t.overdue = t.spared = None
    started = time.monotonic()
    assert _wait(tasks, max_restarts=1, end_bound=10.0) is None
    assert time.monotonic() - started < 5.0
    assert ps0.spared == ps1.spared == "no worker is left to report done to it"
    assert ps0.overdue is None and ps1.overdue is None and frozen.starts == 1
    # A ps that every worker reported done to is stuck: it waits out the bound, overdue.
    ps0 = _FakeTask("ps", 0, None)
    tasks = [ps0, chief, other]
    for t in tasks:
        t.overdue = t.spared = None
    started = time.monotonic()
    assert _wait(tasks, max_restarts=1, end_bound=0.5) is ps0
    assert time.monotonic() - started >= 0.5
    assert ps0.spared is None and "stopped by the launcher" in ps0.overdue


def test_a_task_spared_at_the_end_is_stopped_but_not_reported_blocked(tmp_path):
    """Before, the summary's row of a ps stopped after a verified run said "BLOCKED: still
    running at the end", in a run that ended 0."""
    from sync_mnist.task import report
    from sync_mnist.launcher import launch

    task = launch._Task.__new__(launch._Task)  # its fields only: no process is started
    task.role, task.index, task.summary = "ps", 0, tmp_path / "none.json"
    task.proc = type("Proc", (), {"returncode": -2})()
    task.restarts, task.lost, task.spent, task.overdue = 0, False, False, None
    task.stopped, task.spared = True, None
    assert report._note(task.result()) == (
        "BLOCKED: still running at the end; stopped by the launcher")
    task.spared = "no worker is left to report done to it"
    result = task.result()
    assert not result.blocked and result.error is None
    assert report._note(result) == ("stopped after the verified run: no worker is left to "
                                    "report done to it")


def test_workers_a_waiter_says_its_update_waits_for_are_restarted_once_and_not_the_waiter():
    # Issue 56: a waiter past --timeout names the workers its update waits for and waits on;
    # the launcher restarts them (charged), not the waiter. A second waiter naming one just
    # restarted, still starting, restarts nothing more.
    ps, chief, frozen, other = (_FakeTask("ps", 0, None), _FakeTask("worker", 0, None, 0),
                                _FakeTask("worker", 1, None, None, None), _FakeTask("worker", 2, None))
    frozen.up = True
    policy = _policy([ps, chief, frozen, other], max_restarts=2)
    policy.replace(chief, ["worker 1"])
    assert (frozen.killed, frozen.starts, chief.starts) == (1, 2, 1)
    frozen.up = False  # its replacement, starting: spared
    policy.replace(other, ["worker 1"])
    assert (frozen.killed, frozen.starts, other.starts) == (1, 2, 1)
    frozen.up = True  # up, and stuck again: restarted, the second fault
    policy.replace(other, ["worker 1"])
    assert (frozen.killed, frozen.starts) == (2, 3)
    # No restart left: nothing more; the waiter waits out --restart-grace, then exits 200.
    policy.replace(chief, ["worker 1"])
    assert (frozen.killed, frozen.starts) == (2, 3)
    # The launcher's loop takes what the tasks said, in the order they said it.
    report = from_line("[worker 2] warning: waited 20 s for an update after local step 3; "
                       "contributions so far [3, 2, 3]; missing: worker 1 (no gradient for "
                       "update 4); waiting for the replacement of worker 1, for up to "
                       "--restart-grace 120 s more")
    assert report == ["worker 1"]
