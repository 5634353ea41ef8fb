"""Time to accuracy (--eval-every, --target-accuracy): the chief's evaluations, and the cluster's
stop at the first one that reaches the target.

The cluster tests run whole tasks in-process: `ps.run_ps` and `worker.run_worker`, each in a
thread with its own server, on the synthetic dataset (it reaches 90% within a few dozen
updates). Each asserts what the stop promises: the first evaluation at or above the target
stops the run, every worker ends on the same update, the ps counters still verify, every task
(the ps included) returns.
"""

from __future__ import annotations

import json

import pytest

from inprocess_cluster import run_cluster
from sync_mnist.core import early_stop
from sync_mnist.task import report
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig



# ------------------------------------------------------------------ pure parts, no TensorFlow


@pytest.mark.parametrize("token, stop_step, mode, expected", [
    (5, 0, "sync", False),  # no stop announced
    (5, 6, "sync", False),  # an older token (backups: a stale gradient), push on
    (6, 6, "sync", True),  # the token of the last update
    (7, 6, "sync", True),
    (3, 9, "async", True),  # async: stop at once, whatever the step
    (3, 0, "async", False),
])
def test_should_stop(token, stop_step, mode, expected):
    assert early_stop.should_stop(token, stop_step, mode) is expected


def test_end_step_is_the_planned_one_or_the_stop_if_earlier():
    assert early_stop.end_step(100, 0) == 100
    assert early_stop.end_step(100, 41) == 41
    assert early_stop.end_step(100, 100) == 100


def test_evaluations_every_k_updates_and_the_stop_at_the_first_one_reaching_the_target():
    accuracies = iter([0.5, 0.8, 0.91, 0.95])
    steps, requested, clock = [], [], iter(range(100))
    evaluations = early_stop.ChiefEvaluations(
        every=10, target=0.9, evaluate=lambda: (next(accuracies), 0.1),
        read_step=lambda: steps[-1], request_stop=requested.append, clock=lambda: next(clock))
    for token in [*range(1, 25), 27, 31, 33]:  # 25, 26, 28-30 skipped (taken by others)
        steps.append(token)
        evaluations.after_update(token)
    # At 10, 20 and 31 (the first token past 30), not again at 33: the target was reached.
    assert [p.global_step for p in evaluations.points] == [10, 20, 31]
    assert requested == [31]
    assert evaluations.reached.accuracy == 0.91
    result = report.TaskResult(role="worker", index=0, mode="sync")
    evaluations.record(result)
    assert result.updates_to_target == 31 and result.accuracy_at_target == 0.91
    assert result.time_to_target_s == evaluations.reached.seconds == 3  # the clock's 4th tick
    assert [p[0] for p in result.evaluations] == [10, 20, 31]


def test_closing_line_says_when_the_target_was_reached_or_that_it_was_not():
    base = {"global_step": 2400, "target_steps": 2400, "mode": "sync", "target_accuracy": 0.97,
            "updates_to_target": None, "stop_step": None,
            "evaluations": [[100, 2.0, 0.93, 0.2], [200, 4.0, 0.96, 0.1]]}
    assert report.target_line({**base, "target_accuracy": None}) == ""
    assert report.target_line(base) == (
        "\ntarget: test_accuracy 0.97 NOT reached in 2400 updates (2 evaluations, best 0.9600 "
        "at global_step 200); training ran the planned length")
    reached = {**base, "global_step": 1101, "updates_to_target": 1100, "stop_step": 1101,
               "time_to_target_s": 25.25, "accuracy_at_target": 0.9712}
    assert report.target_line(reached) == (
        "\ntarget: test_accuracy 0.9712 >= 0.97 at global_step 1100, 25.2 s into training; "
        "every worker stopped on update 1101 of 2400 planned")


def test_config_rejects_a_target_without_the_proof_counters():
    # The other combinations are command-line errors: tests/fast/test_cli_errors.py.
    with pytest.raises(ConfigError, match=r"^--target-accuracy needs the proof counters; drop "
                                          r"--bench-no-proof$"):
        TrainConfig(train_steps=10, eval_every=5, target_accuracy=0.9, proof=False)


def test_a_worker_without_the_chiefs_target_is_refused_naming_both_values():
    # It would never read the stop, and wait at the end for tokens that never come.
    from sync_mnist.core import membership

    layout = ClusterLayout(("p:1",), ("w0:1", "w1:1"))

    def settings(index, **flags):
        config = TaskConfig(role="worker", index=index, cluster=layout,
                            train=TrainConfig(train_steps=5, **flags))
        return membership.settings(config)

    chief = json.dumps(settings(0, eval_every=5, target_accuracy=0.9))
    with pytest.raises(ConfigError, match=r"^worker 1 has --eval-every none \(the default\) but "
                                          r"the chief has 5; worker 1 has --target-accuracy none "
                                          r"\(the default\) but the chief has 0.9$"):
        membership.check_agreement(settings(1), chief, me="worker 1", restarted_chief=False)
    membership.check_agreement(settings(1, eval_every=5, target_accuracy=0.9), chief,
                               me="worker 1", restarted_chief=False)


def _step_and_update_ops(flags: dict) -> tuple[dict, dict, object]:
    """The ops a normal step and the chief's update run, from the real graph ({name: type}),
    and the stop step's read after the token."""
    import tensorflow as tf

    import mlp_graph

    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(("p:1",), ("w0:1", "w1:1")),
                        train=TrainConfig(train_steps=5, **flags))
    with tf.Graph().as_default():
        g = mlp_graph.build_graph(config, target=5)
        runner = g.training.optimizer.get_chief_queue_runner()

        def closure(fetches):
            seen, todo = {}, [f if isinstance(f, tf.Operation) else f.op for f in fetches]
            while todo:
                op = todo.pop()
                if op.name not in seen:
                    seen[op.name] = op.type
                    todo += [t.op for t in op.inputs] + list(op.control_inputs)
            return seen

        step = closure([g.training.train_op, g.spec.loss, g.spec.train_metrics["accuracy"]])
        update = closure(runner.enqueue_ops)
        return step, {name: t for name, t in update.items() if name not in step}, g.stop.read


def test_the_stop_is_read_on_ps_0_beside_the_token_and_the_flags_change_no_op():
    from collections import Counter

    def kinds(ops):  # op names shift by a suffix when other ops are added: compare the kinds
        return Counter(ops.values())

    # The update always latches the stop (a preemption may ask for it); the step itself
    # touches none of it: the stop step is read by a fetch of its own.
    step, update, read = _step_and_update_ops({})
    assert not [name for name in step if name.startswith("sync_stop/")]
    assert "latch_stop_step" in update
    # The read waits on ps 0 for the token taken there, and nothing of the worker's: it
    # crosses to the worker beside the token, with no round trip more.
    chain = [read.op]  # the identities, then the variable's read
    while chain[-1].type != "ReadVariableOp":
        chain.append(chain[-1].inputs[0].op)
    assert {op.device for op in chain} == {"/job:ps/task:0"}, chain
    (token,) = chain[-1].control_inputs
    assert token.type == "QueueDequeueV2" and token.device == "/job:ps/task:0"
    # --eval-every and --target-accuracy change neither the step nor the update.
    for flags in ({"eval_every": 5}, {"eval_every": 5, "target_accuracy": 0.9}):
        other_step, other_update, _ = _step_and_update_ops(flags)
        assert (kinds(other_step), kinds(other_update)) == (kinds(step), kinds(update))


# ------------------------------------------------------------------ in-process clusters


def test_lockstep_cluster_stops_on_the_update_after_the_first_evaluation_reaching_the_target(
        tmp_path):
    # At the default learning rate the synthetic data is above 60% after 2 updates and near
    # 100% after 6: evaluations every 2 updates, a target of 99%.
    run = run_cluster(3, train_steps=400, eval_every=2, target_accuracy=0.99,
                       logdir=tmp_path / "logdir")
    chief, points = run.chief, run.chief.evaluations
    accuracies = [p[2] for p in points]
    assert len(points) >= 2, points
    # The first evaluation at or above the target is the last one, and it stopped the run.
    assert accuracies[-1] >= 0.99 > max(accuracies[:-1])
    assert [p[0] for p in points] == [2 * (k + 1) for k in range(len(points))]
    reached = points[-1][0]
    assert chief.updates_to_target == reached < 400
    assert chief.accuracy_at_target == accuracies[-1]
    assert chief.time_to_target_s == points[-1][1] > points[0][1] > 0
    # The in-flight update completed, and was the last: every worker stopped on it.
    assert chief.stop_step == reached + 1
    for w in run.workers:
        assert w.last_token == w.global_step == w.local_steps == w.stop_step == reached + 1
        assert w.synchronous, w.verdict
        assert w.verdict.startswith(f"synchronous: each of {reached + 1} updates averaged "
                                    "exactly one gradient from each of 3 workers")
    # The counters, read on the ps: one gradient per worker per update, nothing left over.
    assert run.ps.global_step == reached + 1
    assert run.ps.contributions == run.ps.pushed == [reached + 1] * 3
    # Each evaluation is in TensorBoard, against its global step.
    assert _scalars(tmp_path / "logdir", "test/accuracy") == [
        (step, pytest.approx(accuracy)) for step, _, accuracy, _ in points]


def _scalars(logdir, tag):
    import tensorflow as tf

    return [(event.step, value.simple_value)
            for path in sorted(logdir.glob("events.out.tfevents.*"))
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value if value.tag == tag]


def test_a_target_never_reached_leaves_the_planned_run_as_it_was():
    # At a learning rate of 1e-4 the synthetic data is near 60% after 10 updates, 90% after 20.
    run = run_cluster(2, train_steps=20, eval_every=10, target_accuracy=0.99,
                       learning_rate=1e-4)
    points = run.chief.evaluations
    assert [p[0] for p in points] == [10, 20]
    assert max(p[2] for p in points) < 0.99
    assert run.chief.updates_to_target is None and run.chief.time_to_target_s is None
    assert run.chief.accuracy_at_target is None and run.chief.stop_step is None
    for w in run.workers:
        assert w.last_token == w.global_step == w.local_steps == 20
        assert w.synchronous, w.verdict
    assert run.ps.contributions == [20, 20]


def test_backup_worker_cluster_stops_every_worker_on_one_update():
    run = run_cluster(3, train_steps=400, eval_every=10, target_accuracy=0.9,
                       replicas_to_aggregate=2)
    chief = run.chief
    assert chief.updates_to_target is not None and chief.stop_step < 400
    # With backups the latched update is the first after the chief's request, whichever.
    assert chief.stop_step > chief.updates_to_target
    for w in run.workers:
        assert w.last_token == w.global_step == chief.stop_step
        assert w.synchronous, w.verdict
        assert w.verdict.startswith(f"synchronous with 1 backup worker: each of "
                                    f"{chief.stop_step} updates")
    assert run.ps.global_step == chief.stop_step


def test_async_cluster_stops_every_worker_soon_after_the_target():
    run = run_cluster(2, train_steps=400, eval_every=10, target_accuracy=0.9, mode="async")
    chief = run.chief
    assert chief.updates_to_target is not None
    for w in run.workers:
        assert w.local_steps < 400
        assert w.stop_step == chief.updates_to_target
        assert w.verdict.startswith("asynchronous"), w.verdict
    # Every push was an update of its own, and each worker pushed until it read the stop.
    assert run.ps.global_step == sum(w.local_steps for w in run.workers)


# ------------------------------------------------------------------ the real command line
