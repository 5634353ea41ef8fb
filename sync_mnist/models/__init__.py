"""The built-in models, each written against sync_mnist.api exactly as a user writes theirs.

`--model NAME` picks one of BUILT_IN; `--model pkg.module:NAME` or `--model file.py:NAME` names
a user's `sync_mnist.api.Model` (sync_mnist/models/registry.py loads it).
"""

BUILT_IN = {
    "mlp": "sync_mnist.models.mlp:MODEL",  # the question's MLP 784-256-256-10
    "cnn": "sync_mnist.models.cnn:MODEL",  # two convolutions with batch norm: 99% on MNIST
    "ctr": "sync_mnist.models.ctr:MODEL",  # clicks: a 1,000,000-row embedding table on the ps
}
# The built-in models that read --dataset and --data-dir (MNIST); ctr generates its clicks.
READ_DATASET = ("mlp", "cnn")
DEFAULT = "mlp"
# --epochs when neither it nor --train-steps is given; other models: options.DEFAULT_EPOCHS.
DEFAULT_EPOCHS = {"cnn": 6, "ctr": 1}


# The data options, as the task's and the launcher's command lines take them, and their
# defaults: --dataset and --data-dir for the built-in models that read MNIST (READ_DATASET);
# --data-dir, or --train-files and --eval-files, for the click model (models/clicklog.py).
DATA_OPTIONS = {"dataset": "mnist", "data_dir": None, "train_files": None, "eval_files": None}


def reads_clicks(spec: str) -> bool:
    """Whether model `spec` is the built-in click model (ctr, or ctr.py's SMALL), which reads
    click files where the data options name them."""
    return BUILT_IN.get(spec, spec).startswith("sync_mnist.models.ctr:")


def add_data_arguments(group) -> None:
    """--dataset, --data-dir, --train-files and --eval-files, in an argparse group of the
    command line."""
    from pathlib import Path

    group.add_argument("--dataset", default=None, choices=("mnist", "synthetic"),
                       help="for the built-in mlp and cnn: mnist, the complete MNIST (60,000 "
                            "train / 10,000 test digits); synthetic: generated, not digits, "
                            "for tests (default: mnist)")
    group.add_argument("--data-dir", type=Path, default=None,
                       help="for the built-in mlp and cnn: a directory with your own MNIST: "
                            "the four IDX files (raw or .gz) or mnist.npz; for ctr: a click "
                            "log written by sync-mnist-clicks (its train-* and eval-* files) "
                            "(default: none: the MNIST that ships with sync_mnist; ctr "
                            "generates its clicks)")
    group.add_argument("--train-files", default=None, metavar="PATTERN",
                       help="for ctr: the click log to train on, comma-separated globs of "
                            "Criteo TSV files (a label, 13 integer, 26 hexadecimal columns; "
                            ".gz too) or TFRecord files (.tfrecord, .tfrecord.gz); with "
                            "--eval-files (default: none)")
    group.add_argument("--eval-files", default=None, metavar="PATTERN",
                       help="for ctr: the clicks to evaluate on, as --train-files (default: "
                            "none)")


def data_options(args) -> dict:
    """The data options given on parsed command-line `args` (TrainConfig.data_options):
    those not given are the model's own defaults."""
    return {name: getattr(args, name) for name in DATA_OPTIONS
            if getattr(args, name) is not None}


def data_argv(options: dict) -> list[str]:
    """`options` as a task's command line takes them (the launcher starts tasks with them)."""
    argv = []
    for name in DATA_OPTIONS:
        if options.get(name) is not None:
            argv += ["--" + name.replace("_", "-"), str(options[name])]
    return argv


def data_params(spec: str, options: dict) -> dict:
    """What model `spec` takes into its params from the data options: the MNIST models'
    "dataset" and "data_dir"; the click model's "train_files" and "eval_files" patterns where
    files are given (models/clicklog.py); nothing for any other model.

    Raises:
        sync_mnist.models.data.DataError: the click model's options do not go together.
    """
    options = {**DATA_OPTIONS, **options}
    if reads_clicks(spec):
        from sync_mnist.models import clicklog

        given = clicklog.patterns(options)
        return {} if given is None else {"train_files": given[0], "eval_files": given[1]}
    if spec not in READ_DATASET:
        return {}
    data_dir = options["data_dir"]
    return {"dataset": options["dataset"], "data_dir": None if data_dir is None else str(data_dir)}


def data_name(spec: str, options: dict) -> str | None:
    """The name of the data set model `spec` reads from the data options; None if it reads
    none of them (a model of the user's brings its own data; ctr generates its clicks)."""
    params = data_params(spec, options)
    return params.get("dataset") or params.get("train_files")


def check_data(train) -> None:
    """What can be checked of a built-in model's data before any task starts (the launcher):
    for the models that read MNIST, its files (the shipped copy's digests, or the user's files
    in --data-dir); for the click model, that its files match, can be read, are of one format,
    and were written for its fields; that --train-files and --eval-files go to the click model,
    not the MNIST ones. Nothing for the others, which check their own data as they read it
    (and refuse a data option they have no param of: models/params.py).

    Raises:
        sync_mnist.models.data.DataError: a file is missing, damaged or malformed.
    """
    from sync_mnist.models import data

    options = {**DATA_OPTIONS, **train.data_options}
    if train.model in READ_DATASET:
        params = data_params(train.model, options)
        data.check_source(params["dataset"], params["data_dir"])
    if reads_clicks(train.model):
        params = data_params(train.model, options)
        if params:
            from sync_mnist.models import clicklog

            clicklog.check(params, BUILT_IN.get(train.model, train.model))
    elif train.model in READ_DATASET and (options["train_files"] or options["eval_files"]):
        raise data.DataError(f"--train-files and --eval-files are the click model's (--model "
                             f"ctr), not --model {train.model}'s")
