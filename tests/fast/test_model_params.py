"""--param KEY=VALUE and the data options: the one door to a model's params (models/params.py),
typed by the model's defaults, and refused where the model has no such param."""

from __future__ import annotations

import pytest

from sync_mnist import api as sm
from sync_mnist.core.config import ConfigError, TaskConfig, TrainConfig
from sync_mnist.core.cluster import ClusterLayout
from sync_mnist.models import params
from sync_mnist.task import cli, inputs, options

DEFAULTS = {"units": 2, "rate": 0.1, "use_bias": True, "hidden_units": [256, 256],
            "name": "wide", "data_dir": None, "table": {"a": 1}, "seed": 0}


def _model(defaults: dict) -> sm.Model:
    return sm.Model(lambda *a: None, lambda p: None, lambda p: None, params=defaults)


def _params(defaults: dict, given: tuple[str, ...] = (), **data) -> dict:
    """The params a task gives the model of `defaults` for `--param` texts `given` and the data
    options `data`, through the command line's parse and the task's typing."""
    args = cli.task_parser().parse_args(
        ["--model", "m.py:MODEL", *[a for text in given for a in ("--param", text)],
         *[a for k, v in data.items() for a in ("--" + k.replace("_", "-"), v)]])
    given_params = {**params.given(args.param or ()),
                    **{k: str(getattr(args, k)) for k in data}}  # as options.train_config
    config = TaskConfig(role="worker", index=0, cluster=ClusterLayout(("h:1",), ("h:2",)),
                        train=TrainConfig(model=args.model, train_steps=1, params=given_params))
    return inputs.model_params(config, _model(defaults))


def test_each_value_is_read_as_its_default_s_type():
    got = _params(DEFAULTS, ("units=3", "rate=0.05", "use_bias=false", "hidden_units=512, 64",
                             "name=deep", "data_dir=/d"))
    assert got == {**DEFAULTS, "units": 3, "rate": 0.05, "use_bias": False,
                   "hidden_units": [512, 64], "name": "deep", "data_dir": "/d"}
    assert _params(DEFAULTS)["units"] == 2  # not given: the model's own
    assert _params(DEFAULTS, ("use_bias=1",))["use_bias"] is True
    assert _params(DEFAULTS, ("rate=1",))["rate"] == 1.0
    assert _params(DEFAULTS, ("name=",))["name"] == ""  # text as it is, even none


def test_a_data_option_reaches_the_param_of_its_name():
    assert _params(DEFAULTS, data_dir="/census")["data_dir"] == "/census"
    with pytest.raises(ConfigError) as raised:
        _params({"units": 2}, data_dir="/census")
    assert str(raised.value) == ("--data-dir /census: --model m.py:MODEL has no param "
                                 "'data_dir', so it would be ignored (its params: units)")


def test_a_key_the_model_has_not_is_refused_naming_the_params_it_has():
    with pytest.raises(ConfigError) as raised:
        _params(DEFAULTS, ("unit=3",))
    assert str(raised.value) == (
        "--param unit=3: --model m.py:MODEL has no param 'unit', so it would be ignored (its "
        "params: data_dir, hidden_units, name, rate, table, units, use_bias)")


@pytest.mark.parametrize("text, message", [
    ("units=3.5", "--param units=3.5: '3.5' is not a whole number, as the model's default 2 is"),
    ("rate=fast", "--param rate=fast: 'fast' is not a number, as the model's default 0.1 is"),
    ("use_bias=maybe", "--param use_bias=maybe: 'maybe' is not true or false, as the model's "
                       "default True is"),
    ("hidden_units=512,x", "--param hidden_units=512,x: 'x' is not a whole number, as the "
                           "model's default [256, 256] is"),
    ("table=a", "--param table=a: --model m.py:MODEL's default for it is {'a': 1}, a dict "
                "--param cannot write; set it in the model's params"),
])
def test_a_value_its_default_s_type_cannot_read_is_refused_naming_it(text, message):
    with pytest.raises(ConfigError) as raised:
        _params(DEFAULTS, (text,))
    assert str(raised.value) == message


def test_the_form_the_seed_and_a_key_given_twice_are_refused_on_the_command_line(capsys):
    for argv, message in [
            (["--param", "units"], "argument --param: not KEY=VALUE with KEY a Python name "
                                   "(--param hidden_units=512,512, say)"),
            (["--param", "seed=3"], "argument --param: seed is --seed's, not a param of the "
                                    "model's")]:
        with pytest.raises(SystemExit) as exited:
            cli.task_parser().parse_args(argv)
        assert exited.value.code == 2
        assert capsys.readouterr().err.rstrip().endswith(message)
    with pytest.raises(ConfigError, match=r"^--param units is given twice \(units=3 and "
                                          r"units=4\): give it once$"):
        params.given([("units", "3"), ("units", "4")])


def test_a_data_option_given_both_ways_is_refused():
    args = cli.task_parser().parse_args(["--data-dir", "/a", "--param", "data_dir=/b"])
    with pytest.raises(ConfigError, match=r"^--data-dir /a and --param data_dir=/b: give one$"):
        options.train_config(args)
    args = cli.task_parser().parse_args(["--param", "data_dir=/b", "--param", "units=3"])
    train = options.train_config(args)
    assert train.params == {"data_dir": "/b", "units": "3"}
    train = options.train_config(cli.task_parser().parse_args(["--data-dir", "/b"]))
    assert train.params == {"data_dir": "/b"}  # the same door


def test_the_built_in_models_params_come_through_the_same_door():
    """mlp's and ctr's data are params like any model's: spelled options and --param alike
    reach them, typed; what a model has not is refused (ctr has no dataset)."""
    from sync_mnist.models import ctr, mlp

    args = cli.task_parser().parse_args(["--model", "mlp", "--data-dir", "/digits",
                                         "--param", "hidden_units=64"])
    got = params.of(mlp.MODEL, options.train_config(args))
    assert got == {"dataset": "mnist", "data_dir": "/digits", "hidden_units": [64], "seed": 0}
    args = cli.task_parser().parse_args(["--model", "ctr", "--train-files", "t*", "--param",
                                         "eval_files=e*", "--param", "rows=100"])
    got = params.of(ctr.MODEL, options.train_config(args))
    assert (got["train_files"], got["eval_files"], got["rows"]) == ("t*", "e*", 100)
    args = cli.task_parser().parse_args(["--model", "ctr", "--dataset", "synthetic"])
    with pytest.raises(ConfigError, match=r"^--dataset synthetic: --model ctr has no param "
                                          r"'dataset', so it would be ignored"):
        params.of(ctr.MODEL, options.train_config(args))
