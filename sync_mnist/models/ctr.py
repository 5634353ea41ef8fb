"""A sparse click-through-rate model on generated clicks with a planted truth, written as a
user writes a model.

The model: F categorical fields (26 by default, as in Criteo's click logs), each an int64 id.
Each (field, id) is hashed in the graph into one row of one embedding table of R rows x 16
(1,000,000 rows by default: 64 MB of float32): the row is
`tf.strings.to_hash_bucket_fast("<field>:<id>", R)`, FarmHash64 of the string, so the same id
in two fields lands in two rows, and any int64 id needs no vocabulary. The F rows of an
example are concatenated into a small MLP (one ReLU layer of 64), which gives the logit of a
click; the loss is the logistic loss.

The table is read only through `tf.nn.embedding_lookup`, so the package keeps it on the ps,
cut into one slice of rows per ps, and each lookup gathers the rows on the ps that holds them
(sync_mnist/core/placement.py). A batch looks each distinct row up once (`tf.unique` first): with
ids drawn from a Zipf law most of a batch's ids repeat. Its gradient is IndexedSlices of those
rows, and stays so up to the optimizer on the ps (sync_mnist/core/sync.py).

The optimizer is Adagrad, whose sparse apply touches only the rows of the gradient: each row's
accumulator grows by its own squared gradient. Not the stock AdamOptimizer: its sparse apply
still decays both moments of every row in every update (m = beta1 * m over the whole slot),
a pass over the whole table and its two slots, 192 MB, on every update.

The data (`generate`, models/clicks.py): per field, ids drawn from a Zipf law over a
vocabulary of V ids (the skew of real click logs: a few ids in most examples); a planted weight
per (field, id), drawn from N(0, sigma^2); and a click with probability sigmoid(bias + the sum of the example's F
planted weights). That planted model is the best any model can do, so its own log-loss on the
evaluation set is the floor a run is judged against: the evaluation prints it beside the
model's (`planted_log_loss`, `log_loss`, and the two AUCs). The evaluation examples carry the
planted probability as a feature (`planted_probability`) for that metric alone; the model
never reads it otherwise, and the SavedModel takes the ids only.

`--model ctr` trains it (1,000,000 rows); `--model sync_mnist.models.ctr:SMALL`, 10,000 rows
and fewer, smaller fields, for tests and quick runs.
"""

from __future__ import annotations

import dataclasses
import functools

import tensorflow as tf

import sync_mnist.api as sm
from sync_mnist.models import clicklog
from sync_mnist.models.clicks import IDS, PLANTED, generate

tf1 = tf.compat.v1


PARAMS = {
    "fields": 26,
    "rows": 1_000_000,  # of the embedding table
    "dimension": 16,
    "hidden_units": [64],
    "learning_rate": 0.1,  # Adagrad's
    # Adagrad's starting accumulator, small next to a row's squared gradient (docs/sparse.md):
    # TensorFlow's default of 0.1 held a rare id's row to a fixed, tiny step.
    "initial_accumulator": 1e-5,
    "vocabulary": 200,  # ids per field: every id seen often enough to learn (docs/sparse.md)
    "zipf": 1.1,  # the exponent: P(k-th most frequent id) ~ k**-zipf
    "weight_scale": 0.25,  # sigma of the planted weights
    "bias": -1.0,  # of the planted logit
    "train_examples": 600_000,
    "eval_examples": 50_000,
    "seed": 0,
    # Click files instead of the generated clicks (--data-dir, or --train-files and
    # --eval-files: sync_mnist/models/clicklog.py); None: generated in memory. data_dir's
    # train-* and eval-* files are the two patterns (clicklog.patterns).
    "data_dir": None,
    "train_files": None,
    "eval_files": None,
    "shuffle_buffer": 10_000,  # examples a worker shuffles its files' clicks in
}


def model_fn(features, labels, mode, params):
    ids = features[IDS]
    fields, dimension = params["fields"], params["dimension"]
    rows = hashed_rows(ids, params["rows"])
    table = tf1.get_variable("embedding/table", [params["rows"], dimension],
                             initializer=tf1.truncated_normal_initializer(stddev=0.05))
    distinct, position = tf.unique(tf.reshape(rows, [-1]))
    vectors = tf.nn.embedding_lookup(table, distinct)  # gathered where the rows are
    x = tf.reshape(tf.gather(vectors, position), [-1, fields * dimension])
    for layer, units in enumerate(params["hidden_units"]):
        with tf1.variable_scope(f"layer{layer}"):
            x = tf.nn.relu(_dense(x, units))
    with tf1.variable_scope("logit"):
        logits = tf.squeeze(_dense(x, 1), axis=1)
    probabilities = tf.sigmoid(logits)
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"probabilities": probabilities})
    losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    loss = tf.reduce_mean(losses)
    if mode == sm.ModeKeys.TRAIN:
        return sm.ModelSpec(mode, loss=loss, optimizer=tf1.train.AdagradOptimizer(
            params["learning_rate"], initial_accumulator_value=params["initial_accumulator"]))
    metrics = {"log_loss": tf1.metrics.mean(losses),
               "auc": tf1.metrics.auc(labels, probabilities, num_thresholds=1000)}
    if PLANTED in features:  # generated clicks; a real log has no planted truth
        planted = features[PLANTED]
        metrics["planted_log_loss"] = tf1.metrics.mean(log_loss(labels, planted))
        metrics["planted_auc"] = tf1.metrics.auc(labels, planted, num_thresholds=1000)
    return sm.ModelSpec(mode, loss=loss, eval_metric_ops=metrics)


def hashed_rows(ids: tf.Tensor, rows: int) -> tf.Tensor:
    """int64 [n, fields]: the table row of each (field, id), FarmHash64("<field>:<id>") % rows."""
    fields = ids.shape[1]
    prefixes = tf.constant([f"{f}:" for f in range(fields)])
    keys = tf.strings.join([tf.broadcast_to(prefixes, tf.shape(ids)), tf.strings.as_string(ids)])
    return tf.strings.to_hash_bucket_fast(keys, rows)


def _dense(x: tf.Tensor, units: int) -> tf.Tensor:
    weights = tf1.get_variable("weights", [x.shape[-1], units],
                               initializer=tf1.glorot_uniform_initializer())
    biases = tf1.get_variable("biases", [units], initializer=tf1.zeros_initializer())
    return tf.matmul(x, weights) + biases


def log_loss(labels: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
    p = tf.clip_by_value(p, 1e-7, 1 - 1e-7)
    return -(labels * tf.math.log(p) + (1 - labels) * tf.math.log(1 - p))


def train_input_fn(params):
    if clicklog.patterns(params):  # --data-dir or --train-files: a tf.data.Dataset of them
        return clicklog.train_dataset(params)
    clicks = generate(params, params["train_examples"], part=0)
    return {IDS: clicks.ids}, clicks.labels  # the planted probability: evaluation only


def eval_input_fn(params):
    if clicklog.patterns(params):
        return clicklog.eval_arrays(params)
    clicks = generate(params, params["eval_examples"], part=1)
    return clicks.features(), clicks.labels


def serving_input_fn(params):
    ids = tf1.placeholder(tf.int64, [None, params["fields"]], name=IDS)
    return {IDS: ids}, {IDS: ids}


# The check (before any task starts): the click files, where the params name them, and that
# they were written for this model.
MODEL = sm.Model(model_fn, train_input_fn, eval_input_fn, serving_input_fn=serving_input_fn,
                 params=PARAMS,
                 check=functools.partial(clicklog.check, model="sync_mnist.models.ctr:MODEL"))
# Small enough for tests: 10,000 rows, 8 fields of 200 ids.
SMALL = dataclasses.replace(MODEL, params={
    **PARAMS, "rows": 10_000, "fields": 8, "vocabulary": 200, "hidden_units": [16],
    "weight_scale": 0.5, "train_examples": 40_000, "eval_examples": 10_000,
    "learning_rate": 0.5, "initial_accumulator": 0.1},
    check=functools.partial(clicklog.check, model="sync_mnist.models.ctr:SMALL"))
