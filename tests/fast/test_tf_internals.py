"""The private TensorFlow names this package relies on, checked fast: graphs only, no cluster.

TensorFlow has no public handle on some of what the fix needs: SyncReplicasOptimizer's token
queue, local step and chief queue runner (sync.py), the session creators' hook for their
SessionManager and the attributes it reads (sessions.py), what a slice of a partitioned
variable says of the whole (model.py), the switch for deprecation warnings (tfcompat.py), and
the v1 feature columns' base class a growing table's column extends (growing.py). A TensorFlow that renamed one would fail a cluster run much later, or
worse, quietly bring back the 30 s readiness poll or a traceback at every close. Each check
here names the attribute, and checks that TensorFlow itself still uses it.
"""

from __future__ import annotations

import types

import pytest
import tensorflow as tf

from sync_mnist.core import sessions, sync

tf1 = tf.compat.v1


def _sync_graph(replicas=2):
    """One worker's graph of a 2-worker cluster; the hosts are never contacted."""
    graph = tf.Graph()
    cluster = tf.train.ClusterSpec({"ps": ["ps0:2222"], "worker": ["w0:2222", "w1:2222"]})
    with graph.as_default(), tf1.device(tf1.train.replica_device_setter(
            worker_device="/job:worker/task:0", cluster=cluster)):
        state = sync.build_shared_state(2)
        x = tf1.get_variable("x", initializer=tf.zeros([2]))
        training = sync.build_train_op(tf.reduce_sum(x), state,
                                       tf1.train.GradientDescentOptimizer(0.1), worker_index=0,
                                       num_workers=2, replicas_to_aggregate=replicas,
                                       is_chief=True)
    return graph, training


def test_sync_replicas_optimizer_token_queue_and_local_step():
    # With backups (R < N) the workers share TensorFlow's own token queue.
    graph, training = _sync_graph(replicas=1)
    optimizer = training.optimizer
    assert isinstance(optimizer, tf1.train.SyncReplicasOptimizer)
    # _sync_token_queue: the queue TensorFlow's own get_init_tokens_op fills.
    queue = optimizer._sync_token_queue  # pylint: disable=protected-access
    assert isinstance(queue, tf.queue.QueueBase), "SyncReplicasOptimizer._sync_token_queue"
    with graph.as_default():
        before = set(graph.get_operations())
        optimizer.get_init_tokens_op(num_tokens=1)
    filled = {op.inputs[0].op.name for op in set(graph.get_operations()) - before
              if op.type.startswith("QueueEnqueueMany")}
    assert filled == {queue.queue_ref.op.name}
    assert training.tokens_waiting.op.inputs[0].op.name == queue.queue_ref.op.name
    # _local_step: the per-worker local step that TensorFlow tags each gradient push with.
    local_step = optimizer._local_step  # pylint: disable=protected-access
    assert local_step.op.name.endswith("sync_rep_local_step"), "SyncReplicasOptimizer._local_step"
    assert local_step in graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)
    pushes = [op for op in graph.get_operations() if op.type.endswith("AccumulatorApplyGradient")
              and "who_accumulator" not in op.inputs[0].op.name]
    assert pushes, "no gradient pushes found"
    for push in pushes:  # each push's local_step input reads that very variable
        assert local_step.op.name in _ancestor_names(push.inputs[1])


def test_the_owned_tokens_follow_the_pushes_of_the_stock_train_op():
    # With R = N each worker takes its token from a queue of its own, under the control
    # dependency on the pushes that sync._pushes_before_the_token finds in the stock train op.
    graph, training = _sync_graph()
    dequeues = [op for op in graph.get_operations() if op.type.startswith("QueueDequeue")
                and op.inputs[0].op.name == "sync_token_q_worker_0"]
    assert len(dequeues) == 2  # the training step's, and the rejoin's
    step = next(op for op in dequeues if op.control_inputs)
    pushes = {op for op in graph.get_operations() if op.type.endswith("AccumulatorApplyGradient")
              and "who_accumulator" not in op.inputs[0].op.name}
    assert pushes and pushes == set(step.control_inputs)
    assert step.name in _ancestor_names(training.train_op)
    # The rejoin reading reads the queue after global_step and last_push (none here).
    assert training.rejoin_reading is None


def test_sync_replicas_optimizer_chief_queue_runner_is_the_replaced_one():
    graph, training = _sync_graph()
    optimizer = training.optimizer
    runner = optimizer._chief_queue_runner  # pylint: disable=protected-access
    # What TensorFlow's session hook starts is what sync.py put there, which ends quietly
    # when its session closes.
    assert optimizer.get_chief_queue_runner() is runner
    assert tf.errors.CancelledError in runner.queue_closed_exception_types
    # It never closes the token queues the cluster shares (sync.py says why).
    assert runner.close_op.type == runner.cancel_op.type == "NoOp"
    (hook,) = training.hooks
    with graph.as_default():
        hook.begin()
    assert optimizer.get_chief_queue_runner() is runner


def _ancestor_names(tensor: tf.Tensor) -> set[str]:
    names, todo = set(), [tensor.op]
    while todo:
        op = todo.pop()
        if op.name not in names:
            names.add(op.name)
            todo.extend(t.op for t in op.inputs)
    return names


class _NoSession:
    """Stands in for MonitoredSession: begins its hooks and asks the creator for a session, as
    it does first."""

    def __init__(self, creator, hooks, stop_grace_period_secs):
        for hook in hooks:
            hook.begin()
        self.creator, self.session = creator, creator.create_session()


def _fake_session():
    return types.SimpleNamespace(close=lambda: None)


@pytest.fixture
def no_session(monkeypatch):
    monkeypatch.setattr(tf1.train, "MonitoredSession", _NoSession)


def test_worker_session_creator_uses_the_prompt_session_manager(no_session, monkeypatch):
    polls = []

    def wait_for_session(self, master, config=None, max_wait_secs=None):
        polls.append(self._recovery_wait_secs)  # pylint: disable=protected-access
        return _fake_session()

    monkeypatch.setattr(tf1.train.SessionManager, "wait_for_session", wait_for_session)
    with tf.Graph().as_default():
        tf1.get_variable("v", [1])
        made = sessions.monitored_session("grpc://nowhere:1", is_chief=False, hooks=[],
                                         config=None, timeout=1.0)
    # WorkerSessionCreator._get_session_manager is still the hook its create_session calls,
    # and SessionManager._recovery_wait_secs is still its poll interval.
    assert polls == [sessions.READY_POLL_SECS], "WorkerSessionCreator._get_session_manager"
    assert made.session is not None


def test_chief_session_creator_uses_the_chiefs_session_manager(no_session, monkeypatch,
                                                               tmp_path):
    calls = []

    def prepare(self, master, **kwargs):
        calls.append((type(self), master, kwargs))
        return _fake_session()

    # sessions._ChiefSessionManager, private: the subclass whose use by TensorFlow is checked.
    monkeypatch.setattr(sessions._ChiefSessionManager, "_prepare", prepare)
    # Should TensorFlow use a stock manager after all, it gets no further than this either.
    monkeypatch.setattr(tf1.train.SessionManager, "prepare_session", prepare)
    with tf.Graph().as_default():
        tf1.train.get_or_create_global_step()  # the checkpoint saver's begin needs one
        tf1.get_variable("v", [1])
        sessions.monitored_session("grpc://nowhere:1", is_chief=True, hooks=[], config=None,
                                  timeout=1.0, checkpoint_dir=str(tmp_path), save_steps=100)
    # ChiefSessionCreator._get_session_manager is still the hook its create_session calls, and
    # it still keeps the checkpoint directory as _checkpoint_dir.
    (kind, master, kwargs), = calls
    assert kind is sessions._ChiefSessionManager, "ChiefSessionCreator._get_session_manager"
    assert master == "grpc://nowhere:1"
    assert kwargs["checkpoint_dir"] == str(tmp_path)


def test_deprecation_switch_exists():
    from tensorflow.python.util import deprecation

    # tfcompat.py sets it to hide deprecation warnings; a renamed switch would silently not.
    assert isinstance(getattr(deprecation, "_PRINT_DEPRECATION_WARNINGS", None), bool), (
        "tensorflow.python.util.deprecation._PRINT_DEPRECATION_WARNINGS")


def test_a_slice_names_the_variable_it_cuts():
    from sync_mnist.core import placement

    # placement.whole_variables reads Variable._save_slice_info, as tf1.train.Saver does, to save
    # and check a partitioned variable whole; a renamed attribute would make every slice look
    # like a variable of its own, and a checkpoint of another number of ps look foreign.
    with tf.Graph().as_default():
        whole = tf1.get_variable("w", [10, 3], partitioner=tf1.fixed_size_partitioner(3))
        slices = list(whole)
        info = slices[1]._save_slice_info  # pylint: disable=protected-access
        assert (info.full_name, info.full_shape, info.var_offset) == ("w", [10, 3], [4, 0]), (
            "Variable._save_slice_info")
        assert placement.whole_variables(slices[::-1]) == {"w": placement.Whole([10, 3], slices)}


def test_linear_model_lists_its_bias_through_the_function_placement_replaces():
    import inspect

    from tensorflow.python.feature_column import feature_column as fc_v1

    from sync_mnist.core import placement

    # placement._linear_model_takes_values replaces _get_expanded_variable_list, which
    # linear_model calls on its bias; renamed, linear_model would raise TypeError again on the
    # bias's value that placement hands it (tests/fast/test_feature_column_graph.py).
    placement._linear_model_takes_values()  # pylint: disable=protected-access
    assert getattr(fc_v1._get_expanded_variable_list, "takes_values", False), (
        "tensorflow.python.feature_column.feature_column._get_expanded_variable_list")
    assert "_get_expanded_variable_list(bias)" in inspect.getsource(fc_v1._LinearModel.call)
    with tf.Graph().as_default():
        value = tf.zeros([1])
        assert fc_v1._get_expanded_variable_list(value) == [value]


def test_the_v1_dense_column_base_a_growing_column_extends():
    """growing.Column subclasses feature_column._DenseColumn (no public base for a v1 column):
    its abstract methods are the ones Column writes, and input_layer still takes such a
    column and asks it for its dense tensor."""
    from tensorflow.python.feature_column import feature_column as fc_v1

    from sync_mnist.core import growing

    assert issubclass(growing.Column, fc_v1._DenseColumn)
    assert set(fc_v1._DenseColumn.__abstractmethods__) == {
        "name", "_parse_example_spec", "_transform_feature", "_variable_shape",
        "_get_dense_tensor"}
    assert set(fc_v1._DenseColumn.__abstractmethods__) <= set(vars(growing.Column))
    asked = []

    class Probe(fc_v1._DenseColumn):
        name = "probe"
        _parse_example_spec = {"x": tf.io.FixedLenFeature([2], tf.float32)}

        def _transform_feature(self, inputs):
            return inputs.get("x")

        _variable_shape = tf.TensorShape([2])

        def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
            asked.append(self)
            return inputs.get(self)

    with tf.Graph().as_default():
        out = tf1.feature_column.input_layer({"x": tf.zeros([3, 2])}, [Probe()])
    assert len(asked) == 1 and out.shape.as_list() == [3, 2]
