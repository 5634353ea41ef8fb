"""Property-based fuzzing of every entry point's input, with Hypothesis.

The property, for every input: the entry point either accepts it, and what it made of it is
consistent with the input (a cluster has the tasks the input names, a dataset the counts its
files declare), or it refuses it the documented way: exit 2 with exactly one `error:` line for
a command, or the module's own error, one line naming the file, for data and images. Never a
traceback, never another exit code, never a hang: every example runs under a bound (`bounded`).

The entry points, each in-process and without starting TensorFlow's runtime (the task and the
launcher stop at recorders, as in test_cli_errors.py):
  * `sync-mnist` and `sync-mnist-cluster` arguments: cli.main, launcher_cli.main;
  * TF_CONFIG documents and Slurm environments: cli.main, as a TFJob pod or an srun task runs it;
  * MNIST files: IDX (headers, bodies, gzip) and npz (keys, dtypes, shapes): data.load_dataset;
  * PNG headers, as `sync-mnist predict` checks them before it decodes anything: png.check_header.

The profiles are in conftest.py: `make test` runs "fast", `make soak` runs "soak" (10,000
examples per entry point). The @examples are the regression corpus: inputs that once broke the
property, found by reading the code (issue 19) or by these tests.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import math
import os
import signal
import struct
import tempfile
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from sync_mnist.task import cli, options
from sync_mnist.core import cluster, config
from sync_mnist.models import data
from sync_mnist.tools import png
from sync_mnist.launcher import cli as launcher_cli
from sync_mnist.launcher import launch

RAN = 99  # what the recorders return: validation passed and the task or cluster would have run
EXAMPLE_BOUND_SECS = 20.0  # far above any example here (milliseconds), even on a loaded machine


@contextlib.contextmanager
def bounded(seconds: float = EXAMPLE_BOUND_SECS):
    """Fails the example that runs longer than `seconds`: a hang, not a slow machine."""
    def expired(signum, frame):
        raise AssertionError(f"the example ran longer than {seconds:g} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------ strategies

# What a user can type: any text but NUL (argv and the environment cannot hold it) and lone
# surrogates (they cannot be encoded into either).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=12)


def mostly(usual, unusual):
    """`usual` about five times in six, else `unusual`: most examples get past the first
    check to the ones behind it. (st.one_of(usual, usual, ...) would not weigh: it gives each
    distinct branch an equal share.)"""
    return st.sampled_from([usual] * 5 + [unusual]).flatmap(lambda chosen: chosen)


def choice(*words: str):
    return mostly(st.sampled_from(words), TEXT)


NUMBER = st.one_of(
    st.integers(-3, 12).map(str),
    st.integers(-10**30, 10**30).map(str),
    st.floats().map(repr),
    st.sampled_from(["inf", "-inf", "nan", "1e309", "1e-400", "0.0004", "0.001", "1e9", "1e10",
                     "0x10", "1_000", " 7 ", "\uff15", "", "-", "1.5", "-0", "9" * 5000]),
    TEXT)
COUNT = mostly(st.integers(1, 50).map(str), NUMBER)
SMALL = mostly(st.integers(0, 3).map(str), NUMBER)


def numbers(*usual: str):
    return mostly(st.sampled_from(usual), NUMBER)


HOST = st.sampled_from(["127.0.0.1", "localhost", "h", "[::1]", "", " a", "a:b", "h:01"])
PORT = st.one_of(st.integers(-1, 70_000).map(str),
                 st.sampled_from(["", "02222", "x", "65536", "\u00b2"]))
HOST_ENTRY = st.one_of(st.tuples(HOST, PORT).map(":".join), HOST)
HOSTS = mostly(st.lists(st.integers(1, 65535), min_size=1, max_size=4, unique=True).map(
    lambda ports: ",".join(f"127.0.0.1:{p}" for p in ports)),
    st.one_of(st.lists(HOST_ENTRY, max_size=5).map(",".join), TEXT))
PATH = st.one_of(st.sampled_from(["runs/x", "", ".", "/", "a b"]), TEXT)

# --model SPEC: built-in names, modules and files, and what is near them.
MODEL = mostly(st.sampled_from(["mlp", "sync_mnist.models.mlp:MODEL", "MLP", "mlp:", ":MODEL",
                                "examples/your_model/my_model.py:MODEL", "my_model.py",
                                "examples/your_model/my_model.py:1x", "no_package.m:MODEL",
                                "sync_mnist:MODEL", "a.py:b.py:M", "/:M"]), TEXT)

TRAINING_OPTIONS = {
    "--model": MODEL, "--train-steps": COUNT, "--epochs": COUNT, "--batch-size": COUNT,
    "--learning-rate": numbers("0.001", "0.5", "1e-4"), "--lr-decay": choice("cosine", "none"),
    "--optimizer": choice("adam", "sgd", "momentum"), "--seed": SMALL,
    "--dataset": choice("mnist", "synthetic"), "--data-dir": PATH, "--logdir": PATH,
    "--save-steps": COUNT, "--save-secs": numbers("10", "0.5"), "--export-dir": PATH,
    "--restart-grace": numbers("5", "120", "0"), "--wire-dtype": choice("float32", "bfloat16"),
    "--timeout": numbers("30", "0.5", "300", "1e3"), "--mode": choice("sync", "async"),
    "--replicas-to-aggregate": SMALL, "--setup": choice("fixed", "question"),
    "--log-every": COUNT, "--eval-every": COUNT,
    "--target-accuracy": numbers("0.5", "0.97", "1"), "--summary-json": PATH,
    "--verbose": None, "--bench-no-proof": None, "--warm-start-from": PATH,
    "--warm-start-vars": mostly(st.sampled_from([".*", "dnn/", "("]), TEXT),
    "--warm-start-map": mostly(st.sampled_from(["a=b", "a", "=b", "a=b=c"]), TEXT),
}
TASK_OPTIONS = {**TRAINING_OPTIONS, "--role": choice("ps", "worker", "chief"), "--index": SMALL,
                "--ps-hosts": HOSTS, "--worker-hosts": HOSTS, "--ps": SMALL,
                "--base-port": numbers("2222", "30000")}
LAUNCHER_OPTIONS = {**TRAINING_OPTIONS, "--ps": SMALL, "--workers": SMALL,
                    "--base-port": numbers("0", "2222", "30000"), "--max-restarts": SMALL,
                    "--isolate": choice("auto", "on", "off")}
# Tokens that are no option: abbreviations, separators, help.
STRAY = st.one_of(st.sampled_from(["--", "-", "-x", "--worker", "--ps-host", "--batch", "-h",
                                   "--help", "plot"]), TEXT)
# A valid task, so that most examples get past argparse to the validation behind it.
WORKER_1 = ["--role", "worker", "--index", "1", "--ps-hosts", "127.0.0.1:1",
            "--worker-hosts", "127.0.0.1:2,127.0.0.1:3"]


@st.composite
def argvs(draw, options: dict, base: tuple[list[str], ...] = ([],)) -> list[str]:
    """A command line: maybe a valid start, then options with values, bare, `=`-joined, junk."""
    argv = list(draw(st.sampled_from(base)))
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(sorted(options)))
        kind = draw(st.sampled_from(["pair"] * 10 + ["equals"] * 2 + ["bare", "stray"]))
        if kind == "stray":
            argv.append(draw(STRAY))
        elif options[name] is None or kind == "bare":
            argv.append(name)
        elif kind == "equals":
            argv.append(f"{name}={draw(options[name])}")
        else:
            argv += [name, draw(options[name])]
    return argv


# ------------------------------------------------------------------ running an entry point

@contextlib.contextmanager
def clean_process(environment: dict[str, str] | None = None):
    """The environment without TF_CONFIG or Slurm (plus `environment`), and afterwards the
    process as it was: its environment, logging and SIGTERM handler (main() sets both)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sigterm = signal.getsignal(signal.SIGTERM)
    with mock.patch.dict(os.environ):
        for name in [n for n in os.environ if n == "TF_CONFIG" or n.startswith("SLURM")]:
            del os.environ[name]
        os.environ.update(environment or {})
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, sigterm)
            root.handlers[:], root.level = handlers, level


def run_entry(entry, argv: list[str], environment: dict[str, str] | None = None):
    """(exit code, stdout, stderr, what the recorders got) of entry(argv), in-process."""
    calls = []

    def record(*args, **kwargs):
        calls.append(args[0] if args else kwargs)
        return RAN

    out, err = io.StringIO(), io.StringIO()
    with clean_process(environment), bounded(), \
            mock.patch.object(cli, "run_task", record), \
            mock.patch.object(launch, "run_cluster", record), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = entry(argv)
        except SystemExit as e:  # argparse's own errors, and --help
            code = e.code
    return code, out.getvalue(), err.getvalue(), calls


def assert_one_error_line(code, out: str, err: str, prog: str) -> None:
    """The documented refusal: exit 2, one line on stderr that says `error:`, nothing else."""
    assert code == config.EXIT_USAGE, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(("error: ", f"{prog}: error: ")), lines[0]
    assert lines[0].split("error: ", 1)[1].strip(), "the error says nothing"
    assert out == ""


def assert_accepted_or_refused(code, out: str, err: str, argv: list[str], prog: str) -> bool:
    """True when the entry point accepted argv; otherwise checks that it refused it properly."""
    if code == RAN:
        assert err == "" and out == "", (out, err)
        event("accepted")
        return True
    if code == 0:  # --help, and only that, exits 0 without running anything
        assert {"-h", "--help"} & set(argv) and out.startswith("usage: "), (argv, out)
        event("--help")
        return False
    assert_one_error_line(code, out, err, prog)
    event("refused by argparse" if err.startswith(prog) else "refused")
    return False


def assert_train_is_valid(train: config.TrainConfig, num_workers: int) -> None:
    """What every accepted TrainConfig promises the code that uses it."""
    assert (train.train_steps is None) != (train.epochs is None)
    for value in (train.train_steps, train.epochs, train.batch_size, train.log_every,
                  train.save_steps, train.eval_every):
        assert value is None or value >= 1
    assert train.learning_rate > 0 and math.isfinite(train.learning_rate)
    # Every bounded wait has a deadline that TensorFlow reads as one (0 ms would be none), and
    # that Python's thread waits accept.
    assert int(train.timeout * 1000) >= 1
    assert 2 * train.timeout + config.START_SECS < 9e9
    assert train.save_secs is None or train.save_secs > 0
    assert (train.mode, train.optimizer, train.lr_decay, train.setup) in \
        [(m, o, d, s) for m in config.MODES for o in config.OPTIMIZERS
         for d in config.LR_DECAYS for s in config.SETUPS]
    assert 1 <= train.aggregate(num_workers) <= num_workers
    if train.target_accuracy is not None:
        assert 0 < train.target_accuracy <= 1 and train.eval_every is not None


def assert_layout_is_valid(layout: cluster.ClusterLayout, role: str, index: int) -> None:
    addresses = [cluster.parse_address(a) for a in layout.ps_hosts + layout.worker_hosts]
    assert layout.num_ps >= 1 and layout.num_workers >= 1
    assert len(set(addresses)) == len(addresses)
    assert all(1 <= port <= 65535 for _, port in addresses)
    assert role in cluster.ROLES and 0 <= index < len(layout.hosts(role))


# ---------------------------------------------------------------------- `sync-mnist` flags

@given(argvs(TASK_OPTIONS, base=(*[WORKER_1] * 5, [])).filter(
    lambda argv: argv[:1] not in (["plot"], ["evaluate"], ["predict"])))
@example([*WORKER_1, "--timeout", "inf"])  # OverflowError at the first bounded wait: exit 1
@example([*WORKER_1, "--timeout", "0.0004"])  # timeout_in_ms=0: TensorFlow's "no deadline"
@example([*WORKER_1, "--timeout", "1e309"])  # inf again, spelled as a number
@example([*WORKER_1, "--learning-rate", "inf"])  # trained on NaNs
@example([*WORKER_1, "--worker-hosts", "h:1,[::1]:2,::1:2"])  # one address, twice
@example([*WORKER_1, "\x0c"])  # found here: argparse's message was two lines (str.splitlines)
def test_fuzz_task_command_line(argv):
    code, out, err, tasks = run_entry(cli.main, argv)
    if not assert_accepted_or_refused(code, out, err, argv, "sync-mnist"):
        return
    (task,) = tasks
    args = cli.task_parser().parse_args(argv)
    # Without TF_CONFIG or Slurm: the flags' task, in the flags' (or the default) layout.
    assert (task.role, task.index) == (args.role, args.index)
    ps_default, worker_default = cluster.default_hosts(cluster.DEFAULT_NUM_PS,
                                                       cluster.DEFAULT_NUM_WORKERS)
    for given_hosts, default, hosts in ((args.ps_hosts, ps_default, task.cluster.ps_hosts),
                                        (args.worker_hosts, worker_default,
                                         task.cluster.worker_hosts)):
        assert hosts == (default if given_hosts is None else
                         tuple(h.strip() for h in given_hosts.split(",")))
    assert_layout_is_valid(task.cluster, task.role, task.index)
    assert_train_is_valid(task.train, task.cluster.num_workers)
    train = task.train  # the values given are the values used
    assert (train.batch_size, train.learning_rate, train.timeout, train.seed, train.mode,
            train.model) == (args.batch_size, args.learning_rate, args.timeout, args.seed,
                             args.mode, args.model)
    assert task.summary_json == args.summary_json


# ------------------------------------------------------------- `sync-mnist-cluster` flags

@given(argvs(LAUNCHER_OPTIONS, base=([], ["--workers", "2", "--train-steps", "5"])))
@example(["--base-port", "65534"])  # every task in the namespace exited 2 on its port
@example(["--base-port", "0", "--workers", "63400"])  # 0 is 2222 in the namespace
@example(["--timeout", "inf"])
@example(["--data-dir", "a\nb", "--workers"])  # an error message quoting a line break
@example(["--seed", "-3", "--verbose", "--ps=2", "--summary-json", "x", "--isolate=off"])
def test_fuzz_launcher_command_line(argv):
    code, out, err, clusters = run_entry(launcher_cli.main, argv)
    if not assert_accepted_or_refused(code, out, err, argv, "sync-mnist-cluster"):
        return
    (kwargs,) = clusters
    num_ps, num_workers, base = kwargs["num_ps"], kwargs["num_workers"], kwargs["base_port"]
    assert num_ps >= 1 and num_workers >= 1 and kwargs["max_restarts"] >= 0
    assert 0 <= base and (base or cluster.DEFAULT_BASE_PORT) + num_ps + num_workers - 1 <= 65535
    train = kwargs["train"]
    assert_train_is_valid(train, num_workers)
    # What the launcher accepts, every task accepts: started as run_cluster starts it, each
    # parses its arguments into the same training settings, so none exits 2 after the start.
    ps_hosts, worker_hosts = cluster.default_hosts(num_ps, num_workers,
                                                   base or cluster.DEFAULT_BASE_PORT)
    for role, index in sorted({("ps", 0), ("worker", 0), ("worker", num_workers - 1)}):
        task_argv = ["--role", role, "--index", str(index), "--ps-hosts", ",".join(ps_hosts),
                     "--worker-hosts", ",".join(worker_hosts), *kwargs["task_args"],
                     "--summary-json", "record.json"]
        code, out, err, tasks = run_entry(cli.main, task_argv)
        assert code == RAN and err == "", (task_argv, err)
        assert tasks[0].train == train


# ----------------------------------------------------------------------------- TF_CONFIG

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
JOBS = ("ps", "worker", "chief", "master", "evaluator", "other")


@st.composite
def tf_configs(draw) -> str:
    """A TFJob's TF_CONFIG, often with one thing wrong; or other JSON; or no JSON at all."""
    kind = draw(st.sampled_from(["valid"] * 4 + ["damaged"] * 4 + ["json", "text"]))
    if kind == "json":
        return json.dumps(draw(JSON))
    if kind == "text":
        return draw(TEXT)
    addresses = draw(st.permutations([f"h{i}:{2222 + i}" for i in range(8)]))
    chief_job = draw(st.sampled_from([None, "chief", "master"]))
    num_ps, num_workers = draw(st.integers(1, 2)), draw(st.integers(0 if chief_job else 1, 3))
    spec = {"ps": addresses[:num_ps], "worker": addresses[num_ps:num_ps + num_workers]}
    if chief_job:
        spec[chief_job] = [addresses[-1]]
    task_type = draw(st.sampled_from(sorted(job for job, hosts in spec.items() if hosts)))
    document = {"cluster": spec, "task": {"type": task_type,
                                          "index": draw(st.integers(0, len(spec[task_type]) - 1))}}
    if draw(st.booleans()):
        document["environment"] = "cloud"
    if kind == "damaged":
        damage = draw(st.sampled_from(["job value", "another job", "index", "type", "drop",
                                       "twice", "sparse", "two chiefs", "address"]))
        job = draw(st.sampled_from(sorted(spec)))
        if damage == "job value":
            spec[job] = draw(JSON)
        elif damage == "another job":
            spec[draw(choice("evaluator", "other", "Worker"))] = [addresses[-2]]
        elif damage == "index":
            document["task"]["index"] = draw(st.one_of(st.integers(), st.booleans(),
                                                       st.floats(), TEXT, JSON))
        elif damage == "type":
            document["task"]["type"] = draw(st.one_of(choice(*JOBS), JSON))
        elif damage == "drop":
            target = draw(st.sampled_from(["cluster", "task", "type", "index"]))
            (document if target in ("cluster", "task") else document["task"]).pop(target)
        elif damage == "twice":
            spec[job] = spec[job] + [addresses[0]]
        elif damage == "sparse":
            document["sparseCluster"] = {"worker": {"0": addresses[1]}}
        elif damage == "two chiefs":
            spec["chief"], spec["master"] = [addresses[-1]], [addresses[-2]]
        else:
            spec[job] = [draw(HOST_ENTRY)] + spec[job][1:]
    return json.dumps(document)


@given(tf_configs(), st.sampled_from([[], [], [], ["--role", "worker"], ["--index", "1"],
                                      ["--role", "ps", "--index", "0"]]))
@example("", ["--role", "ps", "--index", "0"])  # found here: an empty TF_CONFIG is none
@example("[" * 100_000, [])  # RecursionError in json.loads: a traceback
@example('{"cluster": {"ps": [' + "1" * 5000 + "]}}", [])  # int() refuses 4300+ digits
@example(json.dumps({"cluster": {"chief": ["c0:1"], "ps": ["p0:1"], "worker": ["c0:1"]},
                     "task": {"type": "worker", "index": 0}}), [])  # the chief twice
def test_fuzz_tf_config(document, flags):
    argv = [*flags, "--dataset", "synthetic", "--train-steps", "5"]
    code, out, err, tasks = run_entry(cli.main, argv, {"TF_CONFIG": document})
    if not assert_accepted_or_refused(code, out, err, argv, "sync-mnist"):
        return
    (task,) = tasks
    if not document:  # an empty TF_CONFIG is none: the flags' task in the default layout
        assert task.cluster.as_dict() == cli.cluster_layout(cli.task_parser().parse_args(
            argv)).as_dict()
        return
    spec, given_task = json.loads(document)["cluster"], json.loads(document)["task"]
    chief = [host for job in cluster.CHIEF_JOBS for host in spec.get(job) or []]
    # The layout is the document's: its ps, and its chief (worker 0) before its workers.
    assert task.cluster.as_dict() == {"ps": spec["ps"], "worker": chief + spec.get("worker", [])}
    kind, index = given_task["type"], given_task["index"]
    expected = {"ps": ("ps", index), "worker": ("worker", index + len(chief))}.get(
        kind, ("worker", 0))  # a chief or master task is worker 0
    assert (task.role, task.index) == expected
    given_flags = dict(zip(flags[::2], flags[1::2]))  # beside TF_CONFIG, they must agree
    assert given_flags.get("--role", task.role) == task.role
    assert given_flags.get("--index", str(task.index)) == str(task.index)
    assert_layout_is_valid(task.cluster, task.role, task.index)


# -------------------------------------------------------------------------------- Slurm

@pytest.fixture(scope="module")
def slurm_resolver():
    """TensorFlow's SlurmClusterResolver, loaded once (as cli.py does for an srun task), so
    that no example's bound counts TensorFlow's import."""
    from sync_mnist.core import tfcompat

    options.before_tensorflow(verbose=False)
    tfcompat.graph_mode(verbose=False)
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

    return slurm_cluster_resolver


NODE_PREFIX = st.sampled_from(["n", "t02n", "node-", "", "a:b", "n1"])
RANGE_END = mostly(st.integers(0, 12), st.integers(0, 10**12))


@st.composite
def node_lists(draw) -> str:
    """Any SLURM_STEP_NODELIST: ranges, lists, zero-padding, repeats, huge ranges, junk."""
    if not draw(st.integers(0, 9)):
        return draw(TEXT)
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(NODE_PREFIX)
        ranges = []
        for _ in range(draw(st.integers(0, 3))):
            low, width = draw(RANGE_END), draw(st.sampled_from([1, 1, 2]))
            high = draw(st.one_of(st.none(), RANGE_END))
            ranges.append(str(low).zfill(width) + ("" if high is None else f"-{high}"))
        parts.append(prefix + (f"[{','.join(ranges)}]" if ranges else ""))
    return ",".join(parts)


@st.composite
def tasks_per_node(draw) -> str:
    """Any SLURM_STEP_TASKS_PER_NODE: counts, repeats (x3), zeros, huge numbers, junk."""
    if not draw(st.integers(0, 9)):
        return draw(TEXT)
    count = mostly(st.integers(0, 4), st.integers(0, 10**12))
    return ",".join(f"{draw(count)}" + (f"(x{draw(count)})" if draw(st.booleans()) else "")
                    for _ in range(draw(st.integers(1, 4))))


@st.composite
def slurm_steps(draw) -> tuple[dict[str, str], list[str]]:
    """(the variables srun gives one task, its sync-mnist flags): a real step (block
    distribution, nodes in sorted order), often with one thing changed."""
    nodes = [f"n{i}" for i in range(1, draw(st.integers(1, 4)) + 1)]
    counts = [draw(st.integers(1, 3)) for _ in nodes]
    rank = draw(st.integers(0, sum(counts) - 1))
    node = next(i for i in range(len(nodes)) if rank < sum(counts[:i + 1]))
    environment = {
        "SLURM_PROCID": str(rank),
        "SLURM_STEP_NODELIST": draw(st.sampled_from([f"n[1-{len(nodes)}]", ",".join(nodes)])),
        "SLURM_STEP_TASKS_PER_NODE": ",".join(map(str, counts)),
        "SLURMD_NODENAME": nodes[node], "SLURM_LOCALID": str(rank - sum(counts[:node]))}
    flags = []
    for flag in draw(st.lists(st.sampled_from(["--ps", "--base-port"]), unique=True)):
        flags += [flag, draw(st.integers(1, 3).map(str) if flag == "--ps" else
                             numbers("2222", "24000", "65530"))]
    if draw(st.integers(0, 2)):
        name = draw(st.sampled_from(sorted(environment)))
        value = draw({"SLURM_STEP_NODELIST": node_lists(), "SLURM_STEP_TASKS_PER_NODE":
                      tasks_per_node()}.get(name, st.one_of(
                          st.integers(0, 8).map(str), st.sampled_from(
                              ["-1", "\u00b2", " 1", "1.0", "9" * 30, "n1", "n2"]), TEXT)))
        if draw(st.integers(0, 5)):
            environment[name] = value
        else:
            del environment[name]
    if draw(st.integers(0, 9)) == 0:
        flags.append(draw(STRAY))
    return environment, flags


def _srun(nodelist: str, tasks: str, rank: str = "0", **more: str) -> tuple[dict, list]:
    return {"SLURM_PROCID": rank, "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": tasks, **more}, []


@given(slurm_steps())
@example(_srun("n1,n1", "2(x2)"))  # the resolver's RuntimeError: a traceback
@example(_srun("n[1-999999999]", "1"))  # a billion names to build first
@example(_srun("n[1-60000]", "2(x60000)"))  # 120,000 tasks for the resolver to lay out
@example(_srun("n1", "3", "\u00b2"))  # isdigit(), but not for int()
@example(_srun("n1", "3", SLURMD_NODENAME="n1", SLURM_LOCALID="\u00b2"))  # likewise
def test_fuzz_slurm_step(slurm_resolver, step):
    environment, flags = step
    # The flags last: a stray first word such as `plot` would be a subcommand.
    argv = ["--dataset", "synthetic", "--train-steps", "5", *flags]
    code, out, err, placed = run_entry(cli.main, argv, environment)
    if not assert_accepted_or_refused(code, out, err, argv, "sync-mnist"):
        return
    (task,) = placed
    args = cli.task_parser().parse_args(argv)
    num_ps = cluster.DEFAULT_NUM_PS if args.ps is None else args.ps
    base = cluster.DEFAULT_BASE_PORT if args.base_port is None else args.base_port
    nodes = slurm_resolver.expand_hostlist(environment["SLURM_STEP_NODELIST"])
    counts = slurm_resolver.expand_tasks_per_node(environment["SLURM_STEP_TASKS_PER_NODE"])
    rank, layout = int(environment["SLURM_PROCID"]), task.cluster
    # The step's tasks, all of them, the first --ps ranks the ps tasks, each on a step's node
    # at a port from --base-port on; this rank is its own task.
    assert (layout.num_ps, layout.num_workers) == (num_ps, sum(counts) - num_ps)
    assert (task.role, task.index) == (("ps", rank) if rank < num_ps else
                                       ("worker", rank - num_ps))
    for host, port in map(cluster.parse_address, layout.ps_hosts + layout.worker_hosts):
        assert host in nodes and base <= port < base + max(counts)
    assert_layout_is_valid(layout, task.role, task.index)


# ------------------------------------------------------------------------ MNIST: IDX files

IMAGES, LABELS = 2051, 2049  # the IDX magic numbers


def _idx(magic: int, dims: list[int], body: bytes) -> bytes:
    return magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + body


@st.composite
def idx_damage(draw, raw: bytes, kind: int, count: int) -> bytes:
    """One IDX file of `kind` damaged one way: its header, its body, its gzip wrapper."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    ndim, damage = (3 if kind == IMAGES else 1), draw(st.sampled_from(
        ["magic", "count", "size", "huge", "cut", "extra", "label", "gzip cut", "gzip bit",
         "empty", "junk"]))
    body = raw[4 + 4 * ndim:]
    dims = [count] + [28] * (ndim - 1)
    if damage == "magic":
        raw = _idx(draw(st.one_of(st.sampled_from([IMAGES, LABELS]),
                                  st.integers(0, 2**32 - 1))), dims, body)
    elif damage in ("count", "size", "huge"):
        at = 0 if damage == "count" or ndim == 1 else draw(st.integers(1, ndim - 1))
        dims[at] = draw(st.integers(0, 2**32 - 1) if damage == "huge" else st.integers(0, 40))
        raw = _idx(kind, dims, body)
    elif damage == "cut":
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif damage == "extra":
        raw = raw + bytes(draw(st.integers(1, 100)))
    elif damage == "label":  # a byte that is no digit, in labels; any byte in images
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(10, 255))]) + body[at + 1:]
        raw = _idx(kind, dims, body)
    elif damage == "empty":
        raw = b""
    elif damage == "junk":
        raw = rng.integers(0, 256, draw(st.integers(0, 64)), dtype=np.uint8).tobytes()
    if damage.startswith("gzip") or draw(st.booleans()):
        raw = gzip.compress(raw, mtime=0)
        if damage == "gzip cut":
            raw = raw[:draw(st.integers(0, len(raw) - 1))]
        elif damage == "gzip bit":
            at = draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + bytes([raw[at] ^ (1 << draw(st.integers(0, 7)))]) + raw[at + 1:]
    return raw


@st.composite
def idx_sets(draw) -> list[bytes]:
    """The four files of MNIST_FILES: a small train and test split, often with one file
    damaged; each raw or gzip-compressed."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    files, kinds = [], []
    for count in (draw(st.integers(1, 4)), draw(st.integers(1, 4))):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, count, dtype=np.uint8)
        files += [_idx(IMAGES, [count, 28, 28], images.tobytes()),
                  _idx(LABELS, [count], labels.tobytes())]
        kinds += [(IMAGES, count), (LABELS, count)]
    if draw(st.integers(0, 2)):
        at = draw(st.integers(0, 3))
        files[at] = draw(idx_damage(files[at], *kinds[at]))
    return [gzip.compress(raw, mtime=0) if raw[:2] != b"\x1f\x8b" and draw(st.booleans())
            else raw for raw in files]


def _header(raw: bytes) -> tuple[int, tuple[int, ...], bytes] | None:
    """(magic, dims, body) as an IDX reader should see the file; None if it is not whole."""
    try:
        raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, zlib.error):
        return None
    magic = int.from_bytes(raw[:4], "big")
    ndim = {IMAGES: 3, LABELS: 1}.get(magic)
    if len(raw) < 4 or ndim is None or len(raw) < 4 + 4 * ndim:
        return None
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return magic, dims, raw[4 + 4 * ndim:]


def assert_data_error(error: data.DataError, *paths: Path) -> None:
    message = str(error)
    assert "\n" not in message and message.startswith(tuple(map(str, paths))), message
    event("refused")


@given(idx_sets())
@example([b"", b"", b"", b""])  # four empty files
@example([_idx(IMAGES, [2**16, 2**16, 2**32 - 1], b""), b"", b"", b""])  # np.prod wrapped
def test_fuzz_idx_files(files):
    with tempfile.TemporaryDirectory() as tmp, bounded():
        paths = [Path(tmp) / name for name in data.MNIST_FILES]
        for path, raw in zip(paths, files):
            path.write_bytes(raw)
        for path, raw in zip(paths, files):  # each file alone, as read_idx reads it
            header = _header(raw)
            try:
                array = data.read_idx(path)
            except data.DataError as e:
                assert_data_error(e, path)
                continue
            assert header is not None, "read a file that is not whole"
            _, dims, body = header
            assert array.dtype == np.uint8 and array.shape == dims and dims[0] >= 1
            assert array.tobytes() == body
        try:
            dataset = data.load_dataset("mnist", tmp)
        except data.DataError as e:
            assert_data_error(e, *paths)
            return
        # Accepted: the counts the headers declare, 28x28 digits, every label a digit.
        event("accepted")
        counts = [_header(raw)[1][0] for raw in files]
        assert (len(dataset.train_images), len(dataset.train_labels),
                len(dataset.test_images), len(dataset.test_labels)) == tuple(counts)
        assert min(counts) >= 1
        for images, labels in ((dataset.train_images, dataset.train_labels),
                               (dataset.test_images, dataset.test_labels)):
            assert images.shape[1:] == (784,) and labels.dtype == np.int64
            assert labels.min() >= 0 and labels.max() <= 9


# ------------------------------------------------------------------------ MNIST: npz files

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
DTYPES = ("int64", "int32", "uint64", "int8", "uint8", "float32", "float64", "bool", "<U2",
          "object", "complex64")


@st.composite
def npz_files(draw) -> bytes:
    """A Keras mnist.npz of small splits, often with one thing wrong: a key, a dtype, a
    shape, a count, a label; or a damaged, truncated or other file."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    arrays = {}
    for split in ("train", "test"):
        count = draw(st.integers(1, 4))
        arrays[f"x_{split}"] = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        arrays[f"y_{split}"] = rng.integers(0, 10, count).astype(
            draw(st.sampled_from(["uint8", "int64", "int32"])))
    damage = draw(st.sampled_from(["none"] * 4 + [
        "missing", "extra", "dtype", "shape", "count", "empty", "float labels", "label",
        "cut", "bit", "npy", "junk"]))
    key = draw(st.sampled_from(NPZ_KEYS))
    if damage == "missing":
        del arrays[key]
    elif damage == "extra":
        arrays[draw(st.sampled_from(["x_val", "X_train", "extra"]))] = arrays[key]
    elif damage == "dtype":
        arrays[key] = arrays[key].astype(draw(st.sampled_from(DTYPES)))
    elif damage == "shape":
        n = len(arrays[key])
        shape = draw(st.sampled_from([(n, 784), (n, 28, 27), (n, 1, 28, 28), (), (n, 1),
                                      (n, 2)]))
        arrays[key] = rng.integers(0, 10, shape).astype(arrays[key].dtype)
    elif damage in ("count", "empty"):
        n = 0 if damage == "empty" else draw(st.integers(0, 5))
        arrays[key] = np.resize(arrays[key], (n, *arrays[key].shape[1:]))
    elif damage == "float labels":
        arrays[key.replace("x_", "y_")] = arrays[key.replace("x_", "y_")] + 0.5
    elif damage == "label":
        y = key.replace("x_", "y_")
        arrays[y] = arrays[y].astype(np.int64)
        arrays[y][draw(st.integers(0, len(arrays[y]) - 1))] = draw(
            st.one_of(st.integers(10, 2**62), st.integers(-2**62, -1)))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    raw = buffer.getvalue()
    if damage == "cut":
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif damage == "bit":
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ (1 << draw(st.integers(0, 7)))]) + raw[at + 1:]
    elif damage == "npy":  # one array, not an archive of them
        buffer = io.BytesIO()
        np.save(buffer, arrays["x_train"])
        raw = buffer.getvalue()
    elif damage == "junk":
        raw = draw(st.binary(max_size=64))
    return raw


@given(npz_files())
@example(b"")
def test_fuzz_npz_file(raw):
    with tempfile.TemporaryDirectory() as tmp, bounded():
        path = Path(tmp) / data.NPZ_FILE
        path.write_bytes(raw)
        try:
            dataset = data.load_dataset("mnist", tmp)
        except data.DataError as e:
            assert_data_error(e, path)
            return
        # Accepted: the archive's four arrays, unchanged, as the model takes them.
        event("accepted")
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in NPZ_KEYS}
        for split in ("train", "test"):
            x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
            images, labels = getattr(dataset, f"{split}_images"), getattr(dataset, f"{split}_labels")
            assert x.dtype == np.uint8 and x.shape[1:] == (28, 28) and len(x) >= 1
            assert np.issubdtype(y.dtype, np.integer)
            np.testing.assert_array_equal(images, x.reshape(len(x), 784))
            np.testing.assert_array_equal(labels, y)
            assert labels.dtype == np.int64 and labels.min() >= 0 and labels.max() <= 9


# ------------------------------------------------------------------------- PNG headers

def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


SIDE = mostly(st.just(28), st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1)))


@st.composite
def png_files(draw) -> bytes:
    """A PNG's first bytes: a 28x28 grayscale header, often with one field changed, cut
    anywhere; or other bytes."""
    if not draw(st.integers(0, 9)):
        return draw(st.binary(max_size=64))
    signature = mostly(st.just(png.SIGNATURE), st.binary(min_size=8, max_size=8))
    ihdr = struct.pack(">IIBBBBB", draw(SIDE), draw(SIDE),
                       draw(mostly(st.just(8), st.sampled_from([1, 2, 4, 16, 0, 255]))),
                       draw(mostly(st.just(0), st.sampled_from([2, 3, 4, 6, 1, 255]))), 0, 0, 0)
    chunk = _chunk(draw(mostly(st.just(b"IHDR"), st.sampled_from([b"IDAT", b"ihdr", b"IEND"]))),
                   draw(mostly(st.just(ihdr), st.binary(max_size=20))))
    raw = draw(signature) + chunk + _chunk(b"IDAT", draw(st.binary(max_size=32))) + \
        _chunk(b"IEND", b"")
    return raw[:draw(st.integers(0, len(raw)))] if not draw(st.integers(0, 5)) else raw


@given(png_files())
@example(png.SIGNATURE + _chunk(b"IHDR", struct.pack(">IIBBBBB", 50_000, 50_000, 8, 0, 0, 0, 0)))
def test_fuzz_png_header(raw):
    path = Path("digit.png")
    with bounded():
        try:
            png.check_header(raw, path)
        except png.ImageError as e:
            message = str(e)
            assert "\n" not in message and message.startswith(f"{path}: "), message
            event("refused")
            return
    # Accepted: the header says 28x28 grayscale, so what is decoded is at most 784 pixels.
    event("accepted")
    assert raw[:16] == png.SIGNATURE + b"\x00\x00\x00\x0dIHDR"
    width, height, _, colour_type = struct.unpack(">IIBB", raw[16:26])
    assert (width, height, colour_type) == (28, 28, 0)
