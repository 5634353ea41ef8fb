"""One optimizer per variable scope, applied as one update: wide & deep's FTRL for its linear
part and Adagrad for its deep part, as a ModelSpec's `optimizer={scope: optimizer}` asks
(api.py states the contract; sync.build_train_op makes the ByScope).

Sync: SyncReplicasOptimizer wraps a ByScope as it wraps one optimizer. Each worker pushes the
gradient of every variable into that variable's accumulator, as before; each update takes the
average of every accumulator once and hands them all to ByScope.apply_gradients, which gives
each optimizer the gradients of its own variables, in one op. The tokens, the counters and the
proof see one optimizer and one update; global_step moves once (by the update itself in sync
mode, here after every optimizer has applied in async mode).
"""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from sync_mnist import api

tf1 = tf.compat.v1
_STOCK_GRADIENTS = tf1.train.Optimizer.compute_gradients


def variable_name(v) -> str:
    """A variable's name as the model made it: a slice's (`dnn/w/part_1`) is the whole's."""
    info = getattr(v, "_save_slice_info", None)  # what tf1.train.Saver reads, too
    return info.full_name if info is not None else v.op.name


class ByScope(tf1.train.Optimizer):
    """An optimizer made of one optimizer per variable scope.

    A variable is under scope "dnn" if its name is "dnn" or starts with "dnn/" (so not
    "dnn_1/w"); api.ModelSpec has checked that no scope is inside another.
    """

    def __init__(self, optimizers: Mapping[str, tf1.train.Optimizer]):
        self._optimizers = {scope.rstrip("/"): opt for scope, opt in optimizers.items()}
        super().__init__(use_locking=False, name="by_scope_" + "_".join(
            opt.get_name() for opt in self._optimizers.values()))

    def scope_of(self, v) -> str | None:
        """The scope `v` is under, or None."""
        name = variable_name(v)
        return next((s for s in self._optimizers if name == s or name.startswith(s + "/")), None)

    def compute_gradients(self, loss, var_list=None, **kwargs):
        """Each optimizer's gradients of its own variables: in one computation when none of the
        optimizers changes compute_gradients, else each by its own (a clipping, say).

        Raises:
          api.ContractError: a trainable variable is under no scope, or a scope holds none.
        """
        if var_list is None:
            var_list = (tf1.trainable_variables()
                        + tf1.get_collection(tf1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
        var_list = list(var_list)
        parts = {scope: [] for scope in self._optimizers}
        for v in var_list:
            scope = self.scope_of(v)
            if scope is not None:
                parts[scope].append(v)
        self._check(var_list, parts)
        if all(type(opt).compute_gradients is _STOCK_GRADIENTS
               for opt in self._optimizers.values()):
            return _STOCK_GRADIENTS(self, loss, var_list, **kwargs)
        grads = {}
        for scope, variables in parts.items():
            grads.update((id(v), g) for g, v in self._optimizers[scope].compute_gradients(
                loss, var_list=variables, **kwargs))
        return [(grads[id(v)], v) for v in var_list]

    def _check(self, var_list, parts) -> None:
        # Every one, not only those the loss depends on: a step reads each ps's variables in
        # one packed tensor (placement.pulled), so every one of them has a gradient, if zero.
        for v in var_list:
            if self.scope_of(v) is None:
                raise api.ContractError(
                    f"ModelSpec: the trainable variable {variable_name(v)} is under none of "
                    f"the optimizer scopes ({', '.join(sorted(self._optimizers))}): every "
                    "trainable variable needs exactly one")
        for scope, variables in parts.items():
            if not variables:
                raise api.ContractError(
                    f"ModelSpec: the optimizer for scope {scope!r} has no trainable variable "
                    f"under it (the scopes: {', '.join(sorted(self._optimizers))})")

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Each optimizer applies the gradients of its variables, all in one op; then, with a
        global_step (async mode), it moves once."""
        parts: dict[str, list] = {}
        for g, v in grads_and_vars:
            if g is not None:
                parts.setdefault(self.scope_of(v), []).append((g, v))
        applied = [self._optimizers[scope].apply_gradients(pairs)
                   for scope, pairs in parts.items()]
        if global_step is None:
            return tf.group(*applied, name=name or self.get_name())
        with tf.control_dependencies(applied), tf1.colocate_with(global_step):
            return tf1.assign_add(global_step, 1, name=name or self.get_name())

    def get_slot(self, var, name):
        scope = self.scope_of(var)
        return None if scope is None else self._optimizers[scope].get_slot(var, name)

    def get_slot_names(self):
        return sorted({n for opt in self._optimizers.values() for n in opt.get_slot_names()})

    def variables(self):
        return [v for opt in self._optimizers.values() for v in opt.variables()]
