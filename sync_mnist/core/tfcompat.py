"""TensorFlow 1 graph mode on TensorFlow 2, and quiet logs unless asked for."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

# The modules TensorFlow's autograph writes converted functions into: files in the temporary
# directory (tensorflow/python/autograph/pyct/loader.py), each a module of sys.modules.
AUTOGRAPH_MODULES = "__autograph_generated_file"


# Whether defer_keras set TF_USE_LEGACY_KERAS (and so takes it back once TensorFlow is in).
_KERAS_DEFERRED = False
# Set beside TF_USE_LEGACY_KERAS by defer_keras: the value is the package's, not the user's.
# A process started by one that deferred Keras (a task by the launcher, which never takes it
# back) inherits both, and takes TF_USE_LEGACY_KERAS back as its own.
KERAS_DEFERRED_ENV = "SYNC_MNIST_KERAS_DEFERRED"


def defer_keras() -> None:
    """Before TensorFlow is imported: keeps `import tensorflow` from importing Keras 3.

    It imports Keras 3 eagerly, which this graph-mode program never uses: about 0.9 s of CPU
    in every task's start-up, 4 tasks at once on a 2-core machine. With TF_USE_LEGACY_KERAS,
    TensorFlow tries tf_keras instead, which is not installed, and goes on without either
    (tests/cluster/test_task_process.py checks that Keras stays out). The variable is taken
    back once TensorFlow is in (_keras_back), so that a model of the user's that reaches for
    tf.keras gets Keras 3 then, not an ImportError for tf_keras; so is the one a process
    inherits from the launcher that set it (KERAS_DEFERRED_ENV). A TF_USE_LEGACY_KERAS of the
    user's own (with tf_keras installed: the `layers` extra) stays as it is. Once TensorFlow
    is in (an srun step's task imports it to read its host list), it does nothing.
    """
    global _KERAS_DEFERRED
    if "tensorflow" in sys.modules:  # too late: tf.keras would look for tf_keras, and fail
        return
    if "TF_USE_LEGACY_KERAS" not in os.environ:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        os.environ[KERAS_DEFERRED_ENV] = "1"
    _KERAS_DEFERRED = os.environ.get(KERAS_DEFERRED_ENV) == "1"


def _keras_back() -> None:
    """Once TensorFlow is imported: tf.keras, loaded when first used, is Keras 3 again."""
    global _KERAS_DEFERRED
    if _KERAS_DEFERRED:
        os.environ.pop("TF_USE_LEGACY_KERAS", None)
        os.environ.pop(KERAS_DEFERRED_ENV, None)
        _KERAS_DEFERRED = False


def graph_mode(verbose: bool) -> None:
    """Switches TensorFlow to tf.compat.v1 graph mode; hides deprecation noise unless verbose.

    SyncReplicasOptimizer, QueueRunner, Supervisor and replica_device_setter are all deprecated
    tf.compat.v1 APIs; their warnings are expected and say nothing useful to a user.
    """
    with contextlib.nullcontext() if verbose else _stderr_silenced():
        import tensorflow as tf
    _keras_back()
    from tensorflow.python.util import deprecation

    tf.compat.v1.disable_eager_execution()
    if not verbose:
        deprecation._PRINT_DEPRECATION_WARNINGS = False  # no public switch exists
        tf.get_logger().setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="tensorflow")


def eager_mode(verbose: bool) -> None:
    """Loads TensorFlow 2 as it comes (eager), to use an exported model; quiet unless verbose."""
    with contextlib.nullcontext() if verbose else _stderr_silenced():
        import tensorflow as tf
    _keras_back()
    if not verbose:
        tf.get_logger().setLevel(logging.ERROR)
        # The loader's notes on a TF1 SavedModel ("Fingerprint not found") come through absl.
        logging.getLogger("absl").setLevel(logging.ERROR)


@contextlib.contextmanager
def _stderr_silenced():
    """Points file descriptor 2 at /dev/null while TensorFlow loads.

    Its native libraries print start-up notes (absl's "log messages before InitializeLog",
    "Could not find cuda drivers") straight to fd 2, before TF_CPP_MIN_LOG_LEVEL applies.
    """
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def remove_autograph_files() -> None:
    """Removes the files of the functions autograph converted in this process (the input
    functions' maps, say). TensorFlow removes them at exit, which a task's os._exit skips: a
    run left a file a function in the temporary directory, hundreds a day."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith(AUTOGRAPH_MODULES) and path:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:  # the task's end goes on: its exit code says how it ended
                logging.getLogger("sync_mnist").warning("could not remove %s: %s", path,
                                                         e.strerror or e)
