"""A model that breaks the contract of sync_mnist.api is bad input: one line naming the problem.

Each case builds a worker's graph as a task does (inputs.load_shard, prepare.make_graph: no
server is needed for those) from a Model, or resolves a --model SPEC, and asserts the exact line. The
same errors through the real command line (exit 2, the line, the traceback below it) are in
tests/cluster/test_your_model.py.
"""

from __future__ import annotations

import sys
import textwrap
import types

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from mlp_graph import prepared_graph
from sync_mnist.core import membership
from sync_mnist.models import registry
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig
from sync_mnist.models import mlp

tf1 = tf.compat.v1
ROWS = 40


def _data(params):
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, 3)).astype(np.float32), rng.integers(0, 2, ROWS)


def _logits(features):
    w = tf1.get_variable("w", [3, 2], initializer=tf1.zeros_initializer())
    return tf.matmul(features, w)


def _good(features, labels, mode, params):
    logits = _logits(features)
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"logits": logits})
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    return sm.ModelSpec(mode, loss=loss)


def _graph(model_fn=_good, train_input_fn=_data, **train):
    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(("p:1",), ("w0:1", "w1:1")),
                        train=TrainConfig(**{"train_steps": 5, "batch_size": 10, **train}))
    built = prepared_graph(config, sm.Model(model_fn, train_input_fn, _data))
    return types.SimpleNamespace(config=config, g=built.g)


def test_a_model_within_the_contract_builds():
    run = _graph()
    assert run.g.model_settings["model_variables"] == ["w [3, 2] float32"]


def _raises(model_fn, features, labels, mode, params):
    return {}["no such key"]


def _int_loss(features, labels, mode, params):
    _logits(features)
    return sm.ModelSpec(mode, loss=tf.constant(1))


def _vector_loss(features, labels, mode, params):
    return sm.ModelSpec(mode, loss=tf.reduce_sum(_logits(features), axis=1))


def _no_variables(features, labels, mode, params):
    return sm.ModelSpec(mode, loss=tf.reduce_mean(features))


def _loss_of_no_variable(features, labels, mode, params):
    _logits(features)
    return sm.ModelSpec(mode, loss=tf.reduce_mean(features))


def _train_op(features, labels, mode, params):
    loss = tf.reduce_mean(_logits(features))
    return sm.ModelSpec(mode, loss=loss,
                        train_op=tf1.train.AdamOptimizer().minimize(loss))


def _own_sync_optimizer(features, labels, mode, params):
    return sm.ModelSpec(mode, loss=tf.reduce_mean(_logits(features)),
                        optimizer=tf1.train.SyncReplicasOptimizer(tf1.train.AdamOptimizer(), 2))


def _metric_named_loss(features, labels, mode, params):
    loss = tf.reduce_mean(_logits(features))
    return sm.ModelSpec(mode, loss=loss, train_metrics={"loss": loss})


def _metric_named_with_a_space(features, labels, mode, params):
    loss = tf.reduce_mean(_logits(features))
    return sm.ModelSpec(mode, loss=loss, train_metrics={"my loss": loss})


def _not_a_spec(features, labels, mode, params):
    return tf.reduce_mean(_logits(features))


def _wrong_width(features, labels, mode, params):
    w = tf1.get_variable("w", [5, 2])
    return sm.ModelSpec(mode, loss=tf.reduce_mean(tf.matmul(features, w)))


@pytest.mark.parametrize("model_fn, line", [
    (_raises, "the model function raised TypeError in mode 'train': _raises() missing 1 "
              "required positional argument: 'params'"),
    (_int_loss, "ModelSpec: loss must be a float scalar, got int32 of shape ()"),
    (_vector_loss, "ModelSpec: loss must be a float scalar, got float32 of shape (None,)"),
    (_no_variables, "the model function made no trainable variables: nothing to train"),
    (_loss_of_no_variable, "the loss (Mean:0) depends on none of the model's 1 trainable "
                           "variables: nothing to train"),
    (_train_op, "ModelSpec: train_op is refused: return the base optimizer as optimizer=... (or "
                "none, for --optimizer); sync_mnist wraps it in SyncReplicasOptimizer and "
                "builds the train op itself"),
    (_own_sync_optimizer, "ModelSpec: the optimizer is a SyncReplicasOptimizer: return the "
                          "optimizer it wraps; sync_mnist wraps it (with its own tokens and "
                          "counters)"),
    # Logged as name=value on the progress line, and written beside the loss.
    (_metric_named_loss, "ModelSpec: train_metrics['loss']: a name must be a word of letters, "
                         "numbers, _ and /, and not one of the progress line's own (step, "
                         "global_step, loss, examples_per_sec, contributions)"),
    (_metric_named_with_a_space, "ModelSpec: train_metrics['my loss']: a name must be a word of "
                                 "letters, numbers, _ and /, and not one of the progress line's "
                                 "own (step, global_step, loss, examples_per_sec, "
                                 "contributions)"),
    (_not_a_spec, "the model function returned SymbolicTensor in mode 'train', not a "
                  "sync_mnist.api.ModelSpec"),
    # TensorFlow's own words follow; the line is ours up to them.
    (_wrong_width, "the model function raised ValueError in mode 'train': Dimensions must be "
                   "equal, but are 3 and 5 for '{{node MatMul}} ..."),
])
def test_a_model_function_that_breaks_the_contract_is_named_in_one_line(model_fn, line):
    with pytest.raises(sm.ContractError) as raised:
        _graph(model_fn)
    assert isinstance(raised.value, ConfigError)  # bad input: exit 2
    message = str(raised.value)
    assert message.startswith(line[:-3]) if line.endswith("...") else message == line
    assert "\n" not in message


def test_the_users_traceback_comes_with_an_exception_of_the_model_function():
    with pytest.raises(sm.ContractError) as raised:
        _graph(lambda features, labels, mode, params: _good(features, labels, mode, {})["x"])
    assert str(raised.value) == ("the model function raised TypeError in mode 'train': "
                                 "'ModelSpec' object is not subscriptable")
    details = raised.value.details
    assert details.startswith("Traceback (most recent call last):\n")
    assert "test_model_contract.py" in details and "sync_mnist/core/placement.py" not in details
    assert details.endswith("TypeError: 'ModelSpec' object is not subscriptable")


@pytest.mark.parametrize("input_fn, line", [
    (lambda params: [np.zeros((4, 3)), np.zeros(4)],
     "train_input_fn returned list, not a pair (features, labels) of numpy arrays"),
    (lambda params: (np.zeros((ROWS, 3), np.float32), np.zeros(ROWS - 1, np.int64)),
     f"train_input_fn returned {ROWS} rows of features but {ROWS - 1} labels"),
    (lambda params: ({"a": np.zeros((ROWS, 3)), "b": np.zeros(3)}, np.zeros(ROWS)),
     f"train_input_fn returned 3 rows of features['b'] but {ROWS} labels"),
    (lambda params: ([[0.0] * 3] * ROWS, np.zeros(ROWS)),
     "train_input_fn returned features as list, not a numpy array with a first axis of "
     "examples"),
    (lambda params: (np.zeros((0, 3), np.float32), np.zeros(0, np.int64)),
     "train_input_fn returned no examples"),
    (lambda params: open("/nonexistent/data.npz"),
     "train_input_fn raised FileNotFoundError: [Errno 2] No such file or directory: "
     "'/nonexistent/data.npz'"),
])
def test_an_input_function_that_breaks_the_contract_is_named_in_one_line(input_fn, line):
    with pytest.raises(sm.ContractError) as raised:
        _graph(train_input_fn=input_fn)
    assert str(raised.value) == line


@pytest.mark.parametrize("error", [sm.DataError, sm.ConfigError])
def test_an_input_function_s_own_bad_input_error_is_its_line_alone(error):
    """sm.DataError or sm.ConfigError raised by the user's input function is bad input as it
    is (exit 2, `error: ` and its line): not wrapped as `train_input_fn raised ...`, and no
    traceback below it."""
    def train_input_fn(params):
        raise error(f"no rows in /data/{params['seed']}")

    with pytest.raises(error) as raised:
        _graph(train_input_fn=train_input_fn)
    assert str(raised.value) == "no rows in /data/0"
    assert type(raised.value) is error  # not a ContractError, which shows a traceback


def test_eval_every_needs_an_accuracy_metric():
    with pytest.raises(sm.ContractError) as raised:
        _graph(eval_every=2)  # _good has a loss but no eval_metric_ops
    assert str(raised.value) == ("--eval-every and --target-accuracy read the model's eval "
                                 "metric 'accuracy', and its eval_metric_ops have none")


def test_a_shard_smaller_than_a_batch_is_bad_input():
    from sync_mnist.models.data import DataError

    with pytest.raises(DataError, match=r"^batch size 100 is larger than worker 0's shard of "
                                        rf"{ROWS // 2} examples \({ROWS} examples / 2 workers\)$"):
        _graph(batch_size=100)


# ------------------------------------------------------------------------------ --model SPEC


def test_a_built_in_name_a_module_and_a_file_resolve(tmp_path):
    assert registry.resolve("mlp") is mlp.MODEL
    assert registry.resolve("sync_mnist.models.mlp:MODEL") is mlp.MODEL
    path = tmp_path / "mine.py"
    path.write_text("from sync_mnist.models.mlp import MODEL as MINE\n")
    assert registry.resolve(f"{path}:MINE") is mlp.MODEL


def test_a_model_file_imports_a_module_beside_it_from_any_working_directory(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's directory goes in it
    (tmp_path / "models").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    (tmp_path / "models" / "issue55_beside.py").write_text(
        "from sync_mnist.models.mlp import MODEL\n")
    path = tmp_path / "models" / "mine.py"
    path.write_text("from issue55_beside import MODEL as MINE\n")
    try:
        assert registry.resolve(f"{path}:MINE") is mlp.MODEL
    finally:
        sys.modules.pop("issue55_beside", None)


@pytest.mark.parametrize("spec, line", [
    ("cnn2", "--model 'cnn2' is neither a built-in model (mlp, cnn, ctr) nor MODULE:NAME or "
             "FILE.py:NAME"),
    ("mine.py", "--model 'mine.py' is neither a built-in model (mlp, cnn, ctr) nor MODULE:NAME or "
                "FILE.py:NAME"),
    ("no/such/file.py:MODEL", "--model 'no/such/file.py:MODEL': no such file no/such/file.py"),
    ("no_such_package.models:MODEL", "--model 'no_such_package.models:MODEL': no module named "
                                     "'no_such_package'"),
    ("sync_mnist.models.no_such:MODEL", "--model 'sync_mnist.models.no_such:MODEL': no module "
                                        "named 'sync_mnist.models.no_such'"),
    ("sync_mnist.models.mlp:NOPE", "--model 'sync_mnist.models.mlp:NOPE': "
                                   "sync_mnist.models.mlp has no name 'NOPE'"),
    ("sync_mnist.models.mlp:model_fn", "--model 'sync_mnist.models.mlp:model_fn': model_fn is "
                                       "a function, not a sync_mnist.api.Model"),
])
def test_a_spec_that_names_no_model_is_named_in_one_line(spec, line):
    with pytest.raises(ConfigError) as raised:
        registry.resolve(spec)
    assert str(raised.value) == line


def test_a_model_file_that_raises_while_it_loads_shows_its_own_traceback(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(textwrap.dedent("""\
        import sync_mnist.api as sm

        def helper():
            return 1 / 0

        MODEL = helper()
        """))
    with pytest.raises(sm.ContractError) as raised:
        registry.resolve(f"{path}:MODEL")
    assert str(raised.value) == (f"--model '{path}:MODEL': {path} raised ZeroDivisionError "
                                 "while it loaded: division by zero")
    assert f'File "{path}", line 4, in helper' in raised.value.details
    assert "importlib" not in raised.value.details


# ------------------------------------------------------------------------- the same model


def test_a_worker_with_another_version_of_the_model_is_named():
    one = _graph()
    other = _graph(_wrong_width_but_builds)
    mine = membership.settings(other.config, other.g.model_settings)
    published = membership.settings(one.config, one.g.model_settings)
    import json

    with pytest.raises(ConfigError) as raised:
        membership.check_agreement(mine, json.dumps(published), me="worker 1",
                                   restarted_chief=False)
    assert str(raised.value) == ("worker 1 has another model than the chief (--model file or "
                                 "version): worker 1 has variable w [3, 4] float32; the chief "
                                 "has variable w [3, 2] float32")


def _wrong_width_but_builds(features, labels, mode, params):
    w = tf1.get_variable("w", [3, 4])
    return sm.ModelSpec(mode, loss=tf.reduce_mean(tf.matmul(features, w)))
