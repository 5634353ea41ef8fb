"""The optimizers the command line names (--optimizer, --learning-rate, --lr-decay), for a
model whose ModelSpec leaves the optimizer to it; SyncReplicasOptimizer wraps the one made.
"""

from __future__ import annotations

import tensorflow as tf

tf1 = tf.compat.v1


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
