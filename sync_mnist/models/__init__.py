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


# --dataset and --data-dir, as the task's and the launcher's command lines take them: the
# options of the built-in models that read MNIST (READ_DATASET), and their defaults.
DATA_OPTIONS = {"dataset": "mnist", "data_dir": None}


def add_data_arguments(group) -> None:
    """--dataset and --data-dir, in an argparse group of the command line."""
    from pathlib import Path

    group.add_argument("--dataset", default="mnist", choices=("mnist", "synthetic"),
                       help="for the built-in mlp and cnn: mnist, the complete MNIST (60,000 "
                            "train / 10,000 test digits); synthetic: generated, not digits, "
                            "for tests (default: mnist)")
    group.add_argument("--data-dir", type=Path, default=None,
                       help="for the built-in mlp and cnn: a directory with your own MNIST: "
                            "the four IDX files (raw or .gz) or mnist.npz (default: none: the "
                            "copy that ships with sync_mnist)")


def data_options(args) -> dict:
    """The data options of parsed command-line `args` (TrainConfig.data_options)."""
    return {"dataset": args.dataset, "data_dir": args.data_dir}


def data_argv(options: dict) -> list[str]:
    """`options` as a task's command line takes them (the launcher starts tasks with them)."""
    argv = []
    if options.get("dataset") is not None:
        argv += ["--dataset", options["dataset"]]
    if options.get("data_dir") is not None:
        argv += ["--data-dir", str(options["data_dir"])]
    return argv


def data_params(spec: str, options: dict) -> dict:
    """What model `spec` takes into its params from the data options: the MNIST models'
    "dataset" and "data_dir"; nothing for any other model."""
    if spec not in READ_DATASET:
        return {}
    options = {**DATA_OPTIONS, **options}
    data_dir = options["data_dir"]
    return {"dataset": options["dataset"], "data_dir": None if data_dir is None else str(data_dir)}


def data_name(spec: str, options: dict) -> str | None:
    """The name of the data set model `spec` reads from the data options; None if it reads
    none of them (a model of the user's brings its own data)."""
    return data_params(spec, options).get("dataset")


def check_data(train) -> None:
    """What can be checked of a built-in model's data before any task starts (the launcher):
    for the models that read MNIST, its files (the shipped copy's digests, or the user's files
    in --data-dir); nothing for the others, which check their own data as they read it.

    Raises:
        sync_mnist.models.data.DataError: a file is missing, damaged or malformed.
    """
    if train.model in READ_DATASET:
        from sync_mnist.models import data

        options = data_params(train.model, train.data_options)
        data.check_source(options["dataset"], options["data_dir"])
