"""Bad input at the command line: exit code 2 and one line that names the offending value.

Most cases call `cli.main` / `launcher_cli.main` in-process: validation happens before TensorFlow
is imported. `cli.run_task` and `launch.run_cluster` are replaced by recorders, so a case whose
validation wrongly passes fails its assertion instead of starting a server or calling os._exit.
A few cases run the real command line in a subprocess, because the error they test comes from
the running task (its port, its record's path), found before TensorFlow starts. The unreachable
ps, which the task meets only once TensorFlow runs, is in tests/cluster/test_task_process.py.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from procs import run_task_process
from sync_mnist.task import cli, options
from sync_mnist import models
from sync_mnist.launcher import cli as launcher_cli
from sync_mnist.launcher import launch
from sync_mnist.core.cluster import free_ports
from sync_mnist.core.config import EXIT_INTERRUPTED, EXIT_USAGE, TaskTimeout, WarmStart

RAN = 99  # what the recorders return: validation passed and the task/cluster would have run
RUN_CLUSTER = launch.run_cluster  # the real one, for the checks it makes before any task starts


@pytest.fixture(autouse=True)
def recorders(monkeypatch):
    """Records what would have run, in place of the task and the launched cluster."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)  # the tests may run inside an srun step
    calls = {"task": [], "cluster": []}

    def run_task(config, verbose):
        calls["task"].append(config)
        return RAN

    def run_cluster(**kwargs):
        calls["cluster"].append(kwargs)
        return RAN

    monkeypatch.setattr(cli, "run_task", run_task)
    monkeypatch.setattr(launch, "run_cluster", run_cluster)
    # main() installs its SIGTERM handler and logging once validation passes; give pytest's back.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sigterm = signal.getsignal(signal.SIGTERM)
    yield calls
    signal.signal(signal.SIGTERM, sigterm)
    root.handlers[:], root.level = handlers, level


@pytest.fixture
def hosts():
    """Placeholders for the argv templates. Nothing binds them: validation only parses."""
    ps, w0, w1, w2 = (f"127.0.0.1:{p}" for p in free_ports(4))
    return {"ps": ps, "w0": w0, "w1": w1, "w2": w2, "workers": f"{w0},{w1},{w2}"}


def _call(entry, argv) -> int:
    try:
        return entry(argv)
    except SystemExit as e:  # argparse's own errors and --help
        return e.code


def _tf_config(task, workers=("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")) -> str:
    return json.dumps({"cluster": {"ps": ["127.0.0.1:4"], "worker": list(workers)},
                       "task": task})


CLUSTER = ["--ps-hosts", "{ps}", "--worker-hosts", "{workers}"]
TIMEOUT_WHY = "(TensorFlow counts whole milliseconds and reads 0 as no deadline)"
WORKER_1 = ["--role", "worker", "--index", "1", *CLUSTER]

# (argv template, TF_CONFIG or None, the exact stderr line). Templates use `hosts`' keys.
TASK_ERRORS = {
    "unknown role": (["--role", "boss", "--index", "0", *CLUSTER], None,
                     "error: role 'boss' is not one of: ps, worker"),
    "worker index outside": (["--role", "worker", "--index", "5", *CLUSTER], None,
                             "error: worker index 5 is outside the cluster (3 worker tasks: 0-2)"),
    "ps index outside": (["--role", "ps", "--index", "1", *CLUSTER], None,
                         "error: ps index 1 is outside the cluster (1 ps task: 0-0)"),
    "negative index": (["--role", "worker", "--index", "-1", *CLUSTER], None,
                       "error: worker index -1 is outside the cluster (3 worker tasks: 0-2)"),
    "ps host without port": (["--role", "worker", "--index", "0", "--ps-hosts", "127.0.0.1",
                              "--worker-hosts", "{workers}"], None,
                             "error: malformed host:port '127.0.0.1'"),
    "ps port not a number": (["--role", "worker", "--index", "0", "--ps-hosts", "psbox:abc",
                              "--worker-hosts", "{workers}"], None,
                             "error: malformed host:port 'psbox:abc'"),
    "ps port out of range": (["--role", "worker", "--index", "0", "--ps-hosts", "psbox:70000",
                              "--worker-hosts", "{workers}"], None,
                             "error: port 70000 in 'psbox:70000' is outside 1-65535"),
    "empty worker entry": (["--role", "worker", "--index", "0", "--ps-hosts", "{ps}",
                            "--worker-hosts", "{w0},,{w1}"], None,
                           "error: --worker-hosts '{w0},,{w1}' has an empty entry"),
    "duplicate host:port": (["--role", "worker", "--index", "0", "--ps-hosts", "{w1}",
                             "--worker-hosts", "{workers}"], None,
                            "error: {w1} is given twice (ps 0 and worker 1)"),
    "negative train steps": ([*WORKER_1, "--train-steps", "-5"], None,
                             "error: --train-steps must be a positive integer, got -5"),
    "zero train steps": ([*WORKER_1, "--train-steps", "0"], None,
                         "error: --train-steps must be a positive integer, got 0"),
    "zero epochs": ([*WORKER_1, "--epochs", "0"], None,
                    "error: --epochs must be a positive integer, got 0"),
    "zero batch size": ([*WORKER_1, "--batch-size", "0"], None,
                        "error: --batch-size must be a positive integer, got 0"),
    "zero learning rate": ([*WORKER_1, "--learning-rate", "0"], None,
                           "error: --learning-rate must be positive and finite, got 0.0"),
    "negative learning rate": ([*WORKER_1, "--learning-rate", "-0.01"], None,
                               "error: --learning-rate must be positive and finite, got -0.01"),
    "zero timeout": ([*WORKER_1, "--timeout", "0"], None,
                     f"error: --timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got 0.0"),
    # Each of these was accepted: inf ended in OverflowError (exit 1) at the first bounded
    # call, and 0.0004 s became timeout_in_ms=0, which TensorFlow reads as no deadline.
    "infinite timeout": ([*WORKER_1, "--timeout", "inf"], None,
                         f"error: --timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got inf"),
    "nan timeout": ([*WORKER_1, "--timeout", "nan"], None,
                    f"error: --timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got nan"),
    "sub-millisecond timeout": ([*WORKER_1, "--timeout", "0.0004"], None,
                                f"error: --timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, "
                                "got 0.0004"),
    "zero log-every": ([*WORKER_1, "--log-every", "0"], None,
                       "error: --log-every must be a positive integer, got 0"),
    "zero save-secs": ([*WORKER_1, "--save-secs", "0"], None,
                       "error: --save-secs must be positive, got 0.0"),
    "target accuracy without eval-every": ([*WORKER_1, "--target-accuracy", "0.5"], None,
                                           "error: --target-accuracy 0.5 needs --eval-every K: "
                                           "the target is checked at those evaluations"),
    "eval at start in the replay": ([*WORKER_1, "--setup", "question", "--eval-at-start"],
                                    None, "error: --eval-at-start applies to --setup fixed "
                                          "only, not to the question's replay"),
    "negative target accuracy": ([*WORKER_1, "--target-accuracy", "-0.1", "--eval-every", "5"],
                                 None, "error: --target-accuracy must be in (0, 1], a fraction "
                                       "of the evaluation examples, got -0.1"),
    "malformed TF_CONFIG": (["--role", "worker", "--index", "0"], '{"cluster": {ps: []}}',
                            "error: TF_CONFIG is not valid JSON (Expecting property name "
                            "enclosed in double quotes at character 13)"),
    "TF_CONFIG without task": (["--role", "worker", "--index", "0"],
                               json.dumps({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}}),
                               'error: TF_CONFIG has no "task" with "type" and "index" for '
                               'this process'),
    "TF_CONFIG names another task": (["--role", "worker", "--index", "0"],
                                     _tf_config({"type": "worker", "index": 1}),
                                     "error: TF_CONFIG says this task is worker 1, but --role "
                                     "worker --index 0 was given"),
    "TF_CONFIG names another role": (["--role", "worker", "--index", "0"],
                                     _tf_config({"type": "ps", "index": 0}),
                                     "error: TF_CONFIG says this task is ps 0, but --role "
                                     "worker --index 0 was given"),
    "TF_CONFIG task outside its cluster": (["--role", "worker", "--index", "3"],
                                           _tf_config({"type": "worker", "index": 3}),
                                           "error: worker index 3 is outside the cluster "
                                           "(3 worker tasks: 0-2)"),
    # TF_CONFIG alone, as every TFJob pod runs: --role/--index, if given, must agree with it.
    "TF_CONFIG alone, task outside": ([], _tf_config({"type": "worker", "index": 3}),
                                      "error: worker index 3 is outside the cluster "
                                      "(3 worker tasks: 0-2)"),
    "--role beside TF_CONFIG disagrees": (["--role", "ps"],
                                          _tf_config({"type": "worker", "index": 1}),
                                          "error: TF_CONFIG says this task is worker 1, but "
                                          "--role ps was given"),
    "--index beside TF_CONFIG disagrees": (["--index", "2"],
                                           _tf_config({"type": "worker", "index": 1}),
                                           "error: TF_CONFIG says this task is worker 1, but "
                                           "--index 2 was given"),
    "TF_CONFIG evaluator": ([], _tf_config({"type": "evaluator", "index": 0}),
                            "error: TF_CONFIG has an evaluator (a TFJob Evaluator replica): "
                            "sync-mnist has no evaluator task; the chief evaluates on the test "
                            "set at the end; remove that replica"),
    "TF_CONFIG worker map": ([], json.dumps({"cluster": {"ps": ["a:1"], "worker": {"0": "b:1"}},
                                             "task": {"type": "worker", "index": 0}}),
                             "error: TF_CONFIG's 'worker' job is a map, not a list (a TFJob with "
                             "enableDynamicWorker): synchronous training needs a fixed list of "
                             "workers; set enableDynamicWorker to false"),
    "--ps outside an srun step": (["--ps", "2", *WORKER_1], None,
                                  "error: --ps and --base-port apply only in an srun step with "
                                  "no --role, --index, host flags or TF_CONFIG"),
    "--base-port beside TF_CONFIG": (["--base-port", "3000"],
                                     _tf_config({"type": "worker", "index": 1}),
                                     "error: --ps and --base-port apply only in an srun step "
                                     "with no --role, --index, host flags or TF_CONFIG"),
}


def _assert_one_line(captured, expected: str) -> None:
    assert "Traceback" not in captured.err
    assert captured.err.splitlines() == [expected]
    assert captured.out == ""


@pytest.mark.parametrize("argv, tf_config, expected", TASK_ERRORS.values(),
                         ids=TASK_ERRORS.keys())
def test_task_rejects_bad_input_in_one_line(argv, tf_config, expected, hosts, recorders,
                                            capsys, monkeypatch):
    if tf_config is not None:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    code = _call(cli.main, [a.format(**hosts) for a in argv])
    assert code == EXIT_USAGE
    _assert_one_line(capsys.readouterr(), expected.format(**hosts))
    assert recorders["task"] == []


# argparse's own errors: exit 2 through SystemExit; the wording is argparse's, so match a
# fragment that names the offending value.
ARGPARSE_ERRORS = {
    "missing index": (["--role", "worker"], "the following arguments are required: --index"),
    "missing role": (["--index", "0"], "the following arguments are required: --role"),
    "no task at all": ([], "the following arguments are required: --role, --index (or a "
                           "TF_CONFIG, or an srun step)"),
    "index not an integer": (["--role", "worker", "--index", "one"],
                             "argument --index: invalid int value: 'one'"),
    "train steps not an integer": ([*WORKER_1, "--train-steps", "5.5"],
                                   "argument --train-steps: invalid int value: '5.5'"),
    "unknown optimizer": ([*WORKER_1, "--optimizer", "rmsprop"],
                          "argument --optimizer: invalid choice: 'rmsprop'"),
    "unknown mode": ([*WORKER_1, "--mode", "lockstep"],
                     "argument --mode: invalid choice: 'lockstep'"),
    "both lengths": ([*WORKER_1, "--train-steps", "5", "--epochs", "1"],
                     "argument --epochs: not allowed with argument --train-steps"),
    "warm-start map without =": ([*WORKER_1, "--warm-start-from", "x", "--warm-start-map",
                                  "dnn/w"],
                                 "argument --warm-start-map: 'dnn/w' is not NAME=PREV_NAME"),
}


@pytest.mark.parametrize("argv, fragment", ARGPARSE_ERRORS.values(), ids=ARGPARSE_ERRORS.keys())
def test_task_argparse_errors_are_one_line_without_usage(argv, fragment, hosts, capsys):
    code = _call(cli.main, [a.format(**hosts) for a in argv])
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines  # no usage dump
    assert lines[0].startswith("sync-mnist: error: ")
    assert fragment in lines[0]


def test_task_rejects_an_empty_ps_hosts_value(hosts, recorders, capsys):
    code = cli.main(["--role", "worker", "--index", "0", "--ps-hosts", "",
                     "--worker-hosts", hosts["workers"]])
    ran = [c.cluster.as_dict() for c in recorders["task"]]
    assert code == 2, f"validation passed and would have run with {ran}"
    _assert_one_line(capsys.readouterr(), "error: --ps-hosts '' has an empty entry")


def test_task_valid_flags_reach_the_task_as_a_typed_config(hosts, recorders, capsys):
    # The control for the table above: the same flags, valid, pass validation unchanged.
    code = cli.main([*[a.format(**hosts) for a in WORKER_1], "--train-steps", "7",
                     "--batch-size", "32", "--learning-rate", "0.5", "--optimizer", "sgd"])
    assert code == RAN
    assert capsys.readouterr().err == ""
    (config,) = recorders["task"]
    assert (config.role, config.index, config.is_chief) == ("worker", 1, False)
    assert config.cluster.as_dict() == {"ps": [hosts["ps"]],
                                        "worker": [hosts["w0"], hosts["w1"], hosts["w2"]]}
    train = config.train
    assert (train.train_steps, train.epochs, train.batch_size) == (7, None, 32)
    assert (train.learning_rate, train.optimizer, train.mode) == (0.5, "sgd", "sync")


def test_task_without_length_flags_trains_the_default_epochs(hosts, recorders, capsys):
    assert cli.main([a.format(**hosts) for a in WORKER_1]) == RAN
    (config,) = recorders["task"]
    assert (config.train.train_steps, config.train.epochs) == (None, options.DEFAULT_EPOCHS)
    # ... and --help states that same number.
    assert _call(cli.main, ["--help"]) == 0
    entries = _help_entries(capsys.readouterr().out)
    own = "6 for --model cnn, 1 for --model ctr)"
    assert entries["--train-steps"].endswith(f"(default: --epochs {options.DEFAULT_EPOCHS}; {own}")
    assert entries["--epochs"].endswith(
        f"(default: {options.DEFAULT_EPOCHS} unless --train-steps is given; {own}")
    # ... and a built-in model with epochs of its own trains those.
    assert cli.main([a.format(**hosts) for a in WORKER_1] + ["--model", "cnn"]) == RAN
    assert recorders["task"][-1].train.epochs == models.DEFAULT_EPOCHS["cnn"] == 6


def test_task_reads_its_cluster_from_tf_config(recorders, monkeypatch):
    spec = {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": spec, "task": {"type": "worker", "index": 0}}))
    # TF_CONFIG's worker 0 comes after the chief: it is worker 1 of the shared index space.
    assert cli.main(["--role", "worker", "--index", "1", "--train-steps", "3"]) == RAN
    (config,) = recorders["task"]
    assert config.cluster.as_dict() == {"ps": ["p:1"], "worker": ["c:1", "w:1", "w:2"]}


def test_task_without_host_flags_uses_the_launchers_default_layout(recorders):
    assert cli.main(["--role", "worker", "--index", "2", "--train-steps", "3"]) == RAN
    (config,) = recorders["task"]
    assert config.cluster.as_dict() == {
        "ps": ["localhost:2222"],
        "worker": ["localhost:2223", "localhost:2224", "localhost:2225"]}


# ---------------------------------------------------------------------------- the launcher

LAUNCH_ERRORS = {
    "no workers": (["--workers", "0"],
                   "error: --ps 1 --workers 0: a cluster needs at least one of each"),
    "no ps": (["--ps", "0", "--workers", "2"],
              "error: --ps 0 --workers 2: a cluster needs at least one of each"),
    "negative workers": (["--workers", "-3"],
                         "error: --ps 1 --workers -3: a cluster needs at least one of each"),
    "base port out of range": (["--base-port", "70000"],
                               "error: --base-port 70000 is outside 0-65535"),
    # Accepted before: in the private namespace every task then exited 2 on its own port.
    "ports past 65535": (["--base-port", "65534"],
                         "error: --base-port 65534: 1 ps + 3 workers need ports 65534-65537, "
                         "beyond 65535"),
    "ports past 65535 from the default": (["--base-port", "0", "--workers", "63400"],
                                          "error: --base-port 0: 1 ps + 63400 workers need "
                                          "ports 2222-65622, beyond 65535"),
    "infinite timeout": (["--timeout", "inf"],
                         f"error: --timeout must be 0.001-1e+09 s {TIMEOUT_WHY}, got inf"),
    "negative max restarts": (["--max-restarts", "-1"],
                              "error: --max-restarts must be 0 or more, got -1"),
    "zero batch size": (["--batch-size", "0"],
                        "error: --batch-size must be a positive integer, got 0"),
    "negative train steps": (["--train-steps", "-1"],
                             "error: --train-steps must be a positive integer, got -1"),
    "target accuracy without eval-every": (["--target-accuracy", "0.97"],
                                           "error: --target-accuracy 0.97 needs --eval-every K: "
                                           "the target is checked at those evaluations"),
    "target accuracy above 1": (["--target-accuracy", "97", "--eval-every", "100"],
                                "error: --target-accuracy must be in (0, 1], a fraction of the "
                                "evaluation examples, got 97.0"),
    "target accuracy 0": (["--target-accuracy", "0", "--eval-every", "100"],
                          "error: --target-accuracy must be in (0, 1], a fraction of the "
                          "evaluation examples, got 0.0"),
    "zero eval-every": (["--eval-every", "0"],
                        "error: --eval-every must be a positive integer, got 0"),
    "eval-every in the question's replay": (["--eval-every", "10", "--setup", "question"],
                                            "error: --eval-every 10 applies to --setup fixed "
                                            "only, not to the question's replay"),
    "warm-start vars without a source": (["--warm-start-vars", "dnn/.*"],
                                         "error: --warm-start-vars needs --warm-start-from PATH"),
    "warm-start map without a source": (["--warm-start-map", "a=b"],
                                        "error: --warm-start-map needs --warm-start-from PATH"),
    "warm-start vars not a regex": (["--warm-start-from", "x", "--warm-start-vars", "dnn/("],
                                    "error: --warm-start-vars 'dnn/(' is not a regular "
                                    "expression: missing ), unterminated subpattern at "
                                    "position 4"),
    "warm-start map naming a variable twice": (["--warm-start-from", "x", "--warm-start-map",
                                                "a=b", "--warm-start-map", "a=c"],
                                               "error: --warm-start-map names a twice (a=b, "
                                               "a=c)"),
    "warm start in the question's replay": (["--warm-start-from", "x", "--setup", "question"],
                                            "error: --warm-start-from applies to --setup fixed "
                                            "only, not to the question's replay"),
}


@pytest.mark.parametrize("argv, expected", LAUNCH_ERRORS.values(), ids=LAUNCH_ERRORS.keys())
def test_launcher_rejects_bad_input_in_one_line(argv, expected, recorders, capsys):
    assert _call(launcher_cli.main, argv) == 2
    _assert_one_line(capsys.readouterr(), expected)
    assert recorders["cluster"] == []


def test_launcher_valid_flags_reach_the_cluster_and_its_tasks(recorders):
    argv = ["--ps", "2", "--workers", "4", "--base-port=0", "--train-steps", "7",
            "--summary-json", "out.json", "--seed", "3"]
    assert launcher_cli.main(argv) == RAN
    (kwargs,) = recorders["cluster"]
    assert (kwargs["num_ps"], kwargs["num_workers"], kwargs["base_port"]) == (2, 4, 0)
    assert kwargs["train"].train_steps == 7
    assert kwargs["summary_json"] == Path("out.json")
    # The tasks get the training flags, never the launcher's own.
    assert kwargs["task_args"] == ["--train-steps", "7", "--seed", "3"]


def test_launcher_takes_the_warm_start_settings_and_passes_them_to_every_task(recorders):
    warm = ["--warm-start-from", "yesterday", "--warm-start-vars", "dnn/", "--warm-start-vars",
            "linear/", "--warm-start-map=dnn/logits=dnn/old_logits"]
    assert launcher_cli.main(["--train-steps", "7", *warm]) == RAN
    (kwargs,) = recorders["cluster"]
    assert kwargs["train"].warm_start == WarmStart("yesterday", ("dnn/", "linear/"),
                                                   (("dnn/logits", "dnn/old_logits"),))
    assert kwargs["task_args"] == ["--train-steps", "7", *warm]
    assert launcher_cli.main(["--train-steps", "7", "--warm-start-from", "x"]) == RAN
    assert recorders["cluster"][1]["train"].warm_start == WarmStart("x", (".*",), ())


def test_launcher_checks_mnist_files_only_for_the_models_that_read_them(tmp_path, monkeypatch,
                                                                       capsys):
    # Before, the launcher checked MNIST's files for every model: `--model ctr` failed on a
    # --data-dir holding no MNIST. ctr's --data-dir is a click log now (models/clicklog.py):
    # one with no train-* files is that error, and without it ctr's data check passes.
    monkeypatch.setattr(launch, "run_cluster", RUN_CLUSTER)
    empty = tmp_path / "data"
    empty.mkdir()
    # --summary-json a directory: the launcher's next check before any task starts, so that
    # a data check passed ends there too, with no task started.
    argv = ["--data-dir", str(empty), "--summary-json", str(tmp_path), "--isolate", "off",
            "--base-port", "0"]
    assert _call(launcher_cli.main, ["--model", "ctr", *argv]) == 2
    _assert_one_line(capsys.readouterr(),
                     f"error: no training clicks: no file matches {empty}/train-*")
    assert _call(launcher_cli.main, ["--model", "ctr", *argv[2:]]) == 2
    _assert_one_line(capsys.readouterr(),
                     f"error: --summary-json {tmp_path} is a directory, not a file")
    assert _call(launcher_cli.main, ["--model", "mlp", *argv]) == 2
    _assert_one_line(capsys.readouterr(),
                     f"error: no MNIST in --data-dir {empty}: looked for "
                     "train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
                     "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz] or mnist.npz")


CHECKED_MODEL = """
import sync_mnist.api as sm


def check(params):
    if params["units"] < 0:
        params["nothing"]
    if params["units"] == 0:
        raise KeyboardInterrupt  # Ctrl-C, as the launcher loads the model
    raise sm.DataError(f"no rows in {params['data_dir']} for units={params['units']!r}, "
                       f"seed={params['seed']}")


MODEL = sm.Model(lambda *a: None, lambda p: None, lambda p: None,
                 params={"data_dir": "/data", "units": 2}, check=check)
"""


def test_the_launcher_calls_the_model_s_check_with_its_typed_params_before_any_task_starts(
        tmp_path, monkeypatch, capsys):
    # A model file's check (api.Model.check) is called once, with the params every task would
    # give its functions; what it raises is exit 2 before any task starts, as a param the
    # model has not is. Each check here raises, so no task would start.
    monkeypatch.setattr(launch, "run_cluster", RUN_CLUSTER)
    path = tmp_path / "checked.py"
    path.write_text(CHECKED_MODEL)
    argv = ["--model", f"{path}:MODEL", "--isolate", "off", "--base-port", "0"]
    assert _call(launcher_cli.main, [*argv, "--data-dir", "/census", "--param", "units=3",
                                     "--seed", "4"]) == 2
    _assert_one_line(capsys.readouterr(), "error: no rows in /census for units=3, seed=4")
    assert _call(launcher_cli.main, [*argv, "--param", "units=x"]) == 2
    _assert_one_line(capsys.readouterr(), "error: --param units=x: 'x' is not a whole number, "
                                          "as the model's default 2 is")
    assert _call(launcher_cli.main, [*argv, "--param", "units=-1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == [f"error: --model {path}:MODEL's check raised KeyError: 'nothing'",
                         "Traceback (most recent call last):"]
    assert f'File "{path}", line 7, in check' in "\n".join(lines)
    assert _call(launcher_cli.main, [*argv, "--param", "units=0"]) == EXIT_INTERRUPTED
    assert "Traceback" not in capsys.readouterr().err


def test_the_launcher_checks_the_model_in_a_process_of_its_own_and_holds_no_tensorflow():
    # Loading a model loads TensorFlow (about 550 MB), which the launcher would hold for the
    # whole run: the check runs in a process of its own, and a refusal still reaches it.
    probe = (
        "import sys\n"
        "from sync_mnist.launcher import launch\n"
        "from sync_mnist.core.config import ConfigError, TrainConfig\n"
        "launch.check_model(TrainConfig(train_steps=1), False)\n"
        "try:\n"
        "    launch.check_model(TrainConfig(train_steps=1, params={'units': '3'}), False)\n"
        "except ConfigError as e:\n"
        "    print('refused:', e)\n"
        "print('tensorflow loaded:', 'tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out == ["refused: --param units=3: --model mlp has no param 'units', so it would be "
                   "ignored (its params: data_dir, dataset, hidden_units)",
                   "tensorflow loaded: False"]


# Abbreviations: argparse would take `--worker 2` for `--workers 2`, and the launcher would then
# forward it verbatim to every task, where it abbreviates --worker-hosts ("malformed host:port
# '2'"); `--max`, `--iso` and `--base` made every task fail with "unrecognized arguments".
ABBREVIATIONS = {
    "launcher --worker": (launcher_cli.main, "sync-mnist-cluster", ["--worker", "2"]),
    "launcher --max": (launcher_cli.main, "sync-mnist-cluster", ["--max", "1"]),
    "launcher --iso": (launcher_cli.main, "sync-mnist-cluster", ["--iso", "off"]),
    "launcher --base": (launcher_cli.main, "sync-mnist-cluster", ["--base", "0"]),
    "launcher --train": (launcher_cli.main, "sync-mnist-cluster", ["--train", "5"]),
    "task --batch": (cli.main, "sync-mnist", [*WORKER_1, "--batch", "50"]),
    "task --worker": (cli.main, "sync-mnist", ["--role", "worker", "--index", "1",
                                               "--ps-hosts", "{ps}", "--worker", "{workers}"]),
}


@pytest.mark.parametrize("entry, prog, argv", ABBREVIATIONS.values(), ids=ABBREVIATIONS.keys())
def test_abbreviated_options_are_usage_errors_naming_the_option(entry, prog, argv, hosts,
                                                                recorders, capsys):
    argv = [a.format(**hosts) for a in argv]
    abbreviated = [a for a in argv if a in ("--worker", "--max", "--iso", "--base", "--train",
                                            "--batch", "--ps")]
    code = _call(entry, argv)
    assert recorders == {"task": [], "cluster": []}, "the abbreviation was taken for an option"
    assert code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{prog}: error: unrecognized arguments: {abbreviated[0]} "), line


def test_launcher_forwards_exactly_the_training_options(recorders):
    """What the tasks get, parsed by the task's own parser, is the launcher's training config."""
    argv = ["--verbose", "--ps=2", "--train-steps=7", "--seed", "-3", "--workers", "4",
            "--summary-json", "out.json", "--max-restarts", "1", "--isolate", "off",
            "--base-port", "0", "--setup", "fixed", "--batch-size=50", "--timeout", "9",
            "--eval-every", "2", "--target-accuracy=0.9"]
    assert launcher_cli.main(argv) == RAN
    (kwargs,) = recorders["cluster"]
    assert kwargs["task_args"] == ["--verbose", "--train-steps=7", "--seed", "-3", "--setup",
                                   "fixed", "--batch-size=50", "--timeout", "9",
                                   "--eval-every", "2", "--target-accuracy=0.9"]
    assert (kwargs["train"].eval_every, kwargs["train"].target_accuracy) == (2, 0.9)
    task = cli.task_parser().parse_args(["--role", "worker", "--index", "0",
                                         *kwargs["task_args"]])
    assert options.train_config(task) == kwargs["train"]


# ---------------------------------------------------------------------------- --help

def _help_entries(text: str) -> dict[str, str]:
    """argparse help -> {'--option': its help text, rewrapped onto one line}."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"^  -", line):  # an option's first line: two spaces, then its flags
            flags, _, help_start = line.strip().partition("  ")
            current = max(re.findall(r"--?[\w-]+", flags), key=len)
            entries[current] = [help_start]
        elif current and re.match(r"^   +\S", line):  # its help text, continued
            entries[current].append(line)
        else:
            current = None
    return {name: " ".join(" ".join(parts).split()) for name, parts in entries.items()}


def _required_options(text: str) -> set[str]:
    """Options shown outside [brackets] in the usage line are the required ones."""
    usage = " ".join(text.split("\n\n")[0].split())
    while re.search(r"\[[^\[\]]*\]", usage):
        usage = re.sub(r"\[[^\[\]]*\]", "", usage)
    return set(re.findall(r"--[\w-]+", usage))


TRAINING_OPTIONS = {"--model", "--train-steps", "--epochs", "--batch-size", "--learning-rate", "--lr-decay",
                    "--optimizer", "--seed", "--dataset", "--data-dir", "--logdir",
                    "--save-steps", "--save-secs", "--timeout", "--mode",
                    "--replicas-to-aggregate", "--setup", "--log-every", "--summary-json",
                    "--export-dir", "--verbose", "--eval-every", "--eval-at-start",
                    "--target-accuracy",
                    "--restart-grace", "--preempt-grace", "--wire-dtype", "--train-files",
                    "--eval-files", "--warm-start-from", "--warm-start-vars",
                    "--warm-start-map", "--count-examples", "--count-examples-ids", "--param"}


@pytest.mark.parametrize("entry, own_options, required", [
    (cli.main, {"--role", "--index", "--ps-hosts", "--worker-hosts", "--ps", "--base-port"},
     set()),  # --role and --index may come from TF_CONFIG or an srun step
    (launcher_cli.main, {"--ps", "--workers", "--base-port", "--isolate", "--max-restarts"},
     set()),
], ids=["sync-mnist", "sync-mnist-cluster"])
def test_help_exits_0_and_states_every_default(entry, own_options, required, capsys):
    assert _call(entry, ["--help"]) == 0
    text = capsys.readouterr().out
    entries = _help_entries(text)
    assert set(entries) == {"--help"} | own_options | TRAINING_OPTIONS
    assert _required_options(text) == required  # they have no default to state
    missing = {name: h for name, h in entries.items()
               if name not in required | {"--help"} and not re.search(r"\(default: [^)]+\)", h)}
    assert missing == {}


def test_task_help_states_the_real_defaults(capsys):
    """Each stated default is the value argparse actually uses."""
    assert _call(cli.main, ["--help"]) == 0
    entries = _help_entries(capsys.readouterr().out)
    checked = 0
    for action in cli.task_parser()._actions:  # argparse has no public list of its options
        name = max(action.option_strings, key=len)
        if action.default is None or isinstance(action.default, bool) or name == "--help":
            continue
        stated = re.search(r"\(default: ([^)]+)\)", entries[name]).group(1)
        if isinstance(action.default, (int, float)):
            assert float(stated) == action.default, name
        else:
            assert stated == action.default, name
        checked += 1
    assert checked == 15  # model, batch-size, learning-rate, lr-decay, optimizer, seed,
    # save-steps, timeout, mode, setup, log-every, restart-grace, preempt-grace, wire-dtype,
    # count-examples-ids (--dataset's default is the model's: mnist for mlp and cnn)
    assert entries["--ps-hosts"].endswith("(default: TF_CONFIG if set, else localhost:2222)")
    assert "1/K of the model's bytes" in entries["--ps-hosts"]  # how the bytes are split
    assert entries["--worker-hosts"].endswith(
        "(default: TF_CONFIG if set, else localhost:2223,localhost:2224,localhost:2225)")


# ---------------------------------------------------------------------------- real command line

# In tests/fast: the port is checked before TensorFlow is imported.
def test_real_command_names_a_port_already_in_use():
    ps, w0, w1, w2 = free_ports(4)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        held.bind(("127.0.0.1", w1))
        held.listen()
        code, out, err, _ = run_task_process([
            "--role", "worker", "--index", "1", "--ps-hosts", f"127.0.0.1:{ps}",
            "--worker-hosts", f"127.0.0.1:{w0},127.0.0.1:{w1},127.0.0.1:{w2}",
            "--dataset", "synthetic", "--train-steps", "5", "--timeout", "5"])
    assert code == 2, err
    assert "Traceback" not in err
    assert err.splitlines() == [f"error: port {w1} (worker 1, 127.0.0.1:{w1}) is already in use"]
    assert out == ""


# In tests/fast: the record's path is checked before TensorFlow is imported.
def test_real_command_checks_its_summary_json_before_training(tmp_path):
    # Before: the task ran (here: until its ps was found unreachable), then failed to write
    # its record: a traceback at the very end, and no os._exit, so the gRPC server's
    # destructor could hold the process.
    ps, w0, w1 = free_ports(3)
    code, out, err, _ = run_task_process([
        "--role", "worker", "--index", "1", "--ps-hosts", f"127.0.0.1:{ps}",
        "--worker-hosts", f"127.0.0.1:{w0},127.0.0.1:{w1}", "--dataset", "synthetic",
        "--train-steps", "5", "--timeout", "2", "--summary-json", str(tmp_path)])
    assert code == 2, err
    assert err.splitlines() == [f"error: --summary-json {tmp_path} is a directory, not a file"]
    assert out == ""


# In tests/fast: the port is checked before TensorFlow is imported.
def test_real_command_names_a_port_already_in_use_by_a_ps():
    ps, w0, w1 = free_ports(3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        held.bind(("127.0.0.1", ps))
        held.listen()
        code, out, err, _ = run_task_process([
            "--role", "ps", "--index", "0", "--ps-hosts", f"127.0.0.1:{ps}",
            "--worker-hosts", f"127.0.0.1:{w0},127.0.0.1:{w1}",
            "--dataset", "synthetic", "--train-steps", "5", "--timeout", "5"])
    assert code == 2, err
    assert "Traceback" not in err
    assert err.splitlines() == [f"error: port {ps} (ps 0, 127.0.0.1:{ps}) is already in use"]
    assert out == ""


def test_a_stop_that_lands_while_a_failure_is_reported_is_an_interruption_in_one_line(caplog):
    """make chaos (seed 13): worker 1 timed out as the launcher stopped the cluster, and the
    KeyboardInterrupt its SIGTERM raised inside `log.error` came out as a traceback."""
    from sync_mnist.task import report

    def reporting():
        try:
            raise TaskTimeout("worker 1: waited 20 s for an update after local step 30")
        except TaskTimeout:
            raise KeyboardInterrupt from None  # the signal, inside the handler

    result = report.TaskResult(role="worker", index=1, mode="sync")
    assert cli.stopped_as_interrupted(reporting, result) == (result, EXIT_INTERRUPTED)
    assert result.error == "interrupted"
    assert [r.getMessage() for r in caplog.records] == ["interrupted"]
