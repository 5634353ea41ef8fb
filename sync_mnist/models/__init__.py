"""The built-in models, each written against sync_mnist.api exactly as a user writes theirs.

`--model NAME` picks one of BUILT_IN; `--model pkg.module:NAME` or `--model file.py:NAME` names
a user's `sync_mnist.api.Model` (sync_mnist/models/registry.py loads it).
"""

BUILT_IN = {
    "mlp": "sync_mnist.models.mlp:MODEL",  # the question's MLP 784-256-256-10
    "cnn": "sync_mnist.models.cnn:MODEL",  # two convolutions with batch norm: 99% on MNIST
    "ctr": "sync_mnist.models.ctr:MODEL",  # clicks: a 1,000,000-row embedding table on the ps
}
DEFAULT = "mlp"
# --epochs when neither it nor --train-steps is given; other models: options.DEFAULT_EPOCHS.
DEFAULT_EPOCHS = {"cnn": 6, "ctr": 1}
