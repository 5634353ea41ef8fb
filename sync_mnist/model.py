"""Pure graph builders for the question's model: an MLP 784-256-256-10.

Nothing here knows about the cluster. Device placement is decided by the caller with one
`with tf.device(replica_device_setter(...))` around these calls; with `slices=K` (the number
of ps tasks) each weight matrix and bias vector is a partitioned variable of K slices along
its first axis, which the setter's round-robin deals out one slice per ps.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import tensorflow as tf

tf1 = tf.compat.v1

IMAGE_PIXELS = 28 * 28
NUM_CLASSES = 10
HIDDEN_UNITS = (256, 256)


class ModelOutputs(NamedTuple):
    logits: tf.Tensor
    loss: tf.Tensor  # mean cross-entropy over the batch
    accuracy: tf.Tensor  # fraction of the batch classified correctly


def build_model(images: tf.Tensor, labels: tf.Tensor,
                hidden_units: tuple[int, ...] = HIDDEN_UNITS, *, slices: int = 1,
                pull_dtype: str = "float32", reuse: bool = False) -> ModelOutputs:
    """Builds the MLP from plain variables (Keras 3 removed tf.compat.v1.layers).

    Args:
      images: float32 [batch, 784], pixels scaled to [0, 1].
      labels: int64 [batch], digits 0-9.
      hidden_units: widths of the ReLU hidden layers.
      slices, pull_dtype, reuse: see build_logits.

    Returns:
      ModelOutputs with logits [batch, 10] and scalar loss and accuracy.
    """
    logits = build_logits(images, hidden_units, slices=slices, pull_dtype=pull_dtype,
                          reuse=reuse)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    correct = tf.equal(tf.argmax(logits, axis=1), labels)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
    return ModelOutputs(logits, loss, accuracy)


def variable_shapes(hidden_units: tuple[int, ...] = HIDDEN_UNITS) -> list[list[int]]:
    """The shapes of build_logits' variables, whole, in the order it makes them: each layer's
    weights, then its biases (for experiments that stand in for the model's bytes)."""
    sizes = (IMAGE_PIXELS, *hidden_units, NUM_CLASSES)
    shapes = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        shapes += [[fan_in, fan_out], [fan_out]]
    return shapes


def build_logits(images: tf.Tensor, hidden_units: tuple[int, ...] = HIDDEN_UNITS, *,
                 slices: int = 1, pull_dtype: str = "float32", reuse: bool = False) -> tf.Tensor:
    """The MLP alone, for training and for the exported inference graph (export.py).

    Args:
      images: float32 [batch, 784], pixels scaled to [0, 1].
      hidden_units: widths of the ReLU hidden layers.
      slices: 1: plain variables. K > 1: each variable is cut into K slices along its first
        axis (`fixed_size_partitioner`), `layer<k>/weights/part_0` ... `part_<K-1>`, which the
        graph joins (concat) where it uses them. A checkpoint holds each partitioned variable
        whole, under its full name, so it restores with any K.
      pull_dtype: "float32", or "bfloat16": the variables are read in bfloat16 where they live
        and made float32 again where they are used, so a pull from the ps moves half the
        bytes. The layers then compute with the weights rounded to 8 significant bits; the
        variables, and what the optimizer applies to them, stay float32.
      reuse: the variables exist already (a second tower over them, such as the exact
        evaluation beside a bfloat16 training tower).

    Returns:
      logits [batch, 10]; the variables are `layer<k>/weights` and `layer<k>/biases`.
    """
    sizes = (IMAGE_PIXELS, *hidden_units, NUM_CLASSES)
    # Sync: one slice per ps task. The round-robin of replica_device_setter places whole
    # variables, so without slices every weight matrix lands on ps 0 and every bias on ps 1
    # (74.5% of the bytes are layer 0's weights alone).
    partitioner = tf1.fixed_size_partitioner(slices) if slices > 1 else None
    variables = []
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        with tf1.variable_scope(f"layer{layer}", partitioner=partitioner, reuse=reuse or None):
            # Glorot keeps activations at a sane scale; the question's random_normal(stddev=1)
            # saturated the network and is part of why it trained badly.
            variables += [tf1.get_variable("weights", [fan_in, fan_out],
                                           initializer=tf1.glorot_uniform_initializer()),
                          tf1.get_variable("biases", [fan_out],
                                           initializer=tf1.zeros_initializer())]
    values = pulled([list(v) if slices > 1 else [v] for v in variables],
                    tf.as_dtype(pull_dtype))
    x = images
    for layer in range(len(sizes) - 1):
        x = tf.matmul(x, values[2 * layer]) + values[2 * layer + 1]
        if layer < len(sizes) - 2:
            x = tf.nn.relu(x)
    return x


def pulled(parts: Sequence[Sequence[tf.Variable]], dtype: tf.DType = tf.float32
           ) -> list[tf.Tensor]:
    """Each variable whole (given as its slices in order; a plain one is its only slice), as
    float32 where the caller's ops run, read from each device that holds some of them in one
    tensor, as `dtype`.

    Sync: one pull per ps, not one per slice. Each ps packs every slice it holds into one flat
    tensor (cast to `dtype` there, so a narrow copy crosses), and this side cuts it up again:
    every RecvTensor costs both tasks CPU, and a step pulled 6 of them from each ps. Variables
    on no device (the export's graph) are read as they are.
    """
    by_device: dict[str, list[tf.Variable]] = {}
    for part in parts:
        for v in part:
            by_device.setdefault(v.device, []).append(v)
    value = {}
    for device, held in by_device.items():
        if not device and dtype == tf.float32:
            value.update((id(v), v.value()) for v in held)
            continue
        with tf1.device(device):  # Sync: packed (and cast) where the slices live
            packed = tf.concat([tf.reshape(v.value(), [-1]) for v in held], axis=0)
            sent = packed if dtype == tf.float32 else tf.cast(packed, dtype)
        here = sent if dtype == tf.float32 else tf.cast(sent, tf.float32)
        pieces = tf.split(here, [v.shape.num_elements() for v in held])
        value.update((id(v), tf.reshape(p, v.shape)) for v, p in zip(held, pieces))
    return [value[id(part[0])] if len(part) == 1 else
            tf.concat([value[id(v)] for v in part], axis=0) for part in parts]


class Whole(NamedTuple):
    """A variable as a checkpoint and the export hold it: whole, under its full name."""

    shape: list[int]
    slices: list[tf.Variable]  # in order along the first axis; a plain variable is its only one


def whole_variables(variables: Sequence[tf.Variable]) -> dict[str, Whole]:
    """{full name: Whole} for `variables`, their slices gathered under the variable they cut.

    A slice (build_logits with slices > 1, and each optimizer slot made for one, such as
    `layer0/weights/part_1/Adam`) belongs to `layer0/weights` or `layer0/weights/Adam`,
    as tf1.train.Saver writes it; a plain variable stands for itself.
    """
    parts: dict[str, tuple[list[int], list[tuple[int, tf.Variable]]]] = {}
    for v in variables:
        # TensorFlow has no public reader of this; its Saver reads the same attribute.
        info = getattr(v, "_save_slice_info", None)
        if info is None:
            parts[v.op.name] = (v.shape.as_list(), [(0, v)])
        else:
            parts.setdefault(info.full_name, (list(info.full_shape), []))[1].append(
                (info.var_offset[0], v))
    return {name: Whole(shape, [v for _, v in sorted(slices, key=lambda s: s[0])])
            for name, (shape, slices) in parts.items()}


def make_optimizer(name: str, learning_rate: float, *, decay_steps: int | None = None,
                   global_step: tf.Tensor | None = None) -> tf1.train.Optimizer:
    """The base optimizer; in sync mode SyncReplicasOptimizer wraps it.

    With `decay_steps`, the rate falls from `learning_rate` to 0 along a cosine as
    `global_step` goes from 0 to `decay_steps` (and stays 0 beyond).
    """
    if decay_steps:
        # Where global_step is (ps 0 in a cluster): the update runs on the ps tasks, and a
        # rate made under the chief's device would cost each ps a read from the chief in
        # every update.
        with tf1.device(global_step.device):
            learning_rate = tf1.train.cosine_decay(learning_rate, global_step, decay_steps)
    if name == "adam":
        return _Adam(learning_rate)
    if name == "sgd":
        return tf1.train.GradientDescentOptimizer(learning_rate)
    if name == "momentum":
        return tf1.train.MomentumOptimizer(learning_rate, momentum=0.9)
    raise ValueError(f"unknown optimizer {name!r}")


class _Adam(tf1.train.AdamOptimizer):
    """Adam whose update sends each ps one tensor of scalars, not six.

    Sync: the beta powers live beside the first variable (on ps 0), with the learning rate
    when it decays (make_optimizer). The stock update reads each power, the rate and the
    constants beta1, beta2 and epsilon (made where _prepare runs) in every slice's apply:
    with K ps, six RPCs from ps 0 to each other ps in every update (and twelve more before
    the powers were read once). Here ps 0 stacks the powers and the rate into one tensor,
    each ps unstacks its copy once for all its slices, and the constants are made where each
    slice is applied. The values are the same: an update's applies all read the powers
    before its end moves them on.
    """

    _scalars = None  # [beta1_power, beta2_power, learning_rate], on ps 0
    _copies = None  # {device: the unstacked copy of _scalars there}, made anew by _prepare

    def _prepare(self):
        super()._prepare()
        powers = self._get_beta_accumulators()
        with tf1.device(powers[0].device):
            self._scalars = tf.stack([p.read_value() for p in powers]
                                     + [tf.cast(self._lr_t, tf.float32)])
        self._copies = {}

    def _resource_apply_dense(self, grad, var):
        # Made under the apply's colocation with `var`: on var's ps.
        if var.device not in self._copies:
            self._copies[var.device] = tf.unstack(tf.identity(self._scalars))
        beta1_power, beta2_power, lr = self._copies[var.device]
        return tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=self.get_slot(var, "m").handle, v=self.get_slot(var, "v").handle,
            beta1_power=beta1_power, beta2_power=beta2_power, lr=lr,
            beta1=tf.constant(self._beta1, tf.float32), beta2=tf.constant(self._beta2, tf.float32),
            epsilon=tf.constant(self._epsilon, tf.float32), grad=grad,
            use_locking=self._use_locking)
