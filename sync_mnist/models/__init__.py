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


def check_data(train) -> None:
    """What can be checked of a built-in model's data before any task starts (the launcher):
    for the models that read MNIST, its files (the shipped copy's digests, or the user's files
    in --data-dir); nothing for the others, which check their own data as they read it.

    Raises:
        sync_mnist.models.data.DataError: a file is missing, damaged or malformed.
    """
    if train.model in READ_DATASET:
        from sync_mnist.models import data

        data.check_source(train.dataset, train.data_dir)
