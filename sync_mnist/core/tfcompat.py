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


def graph_mode(verbose: bool) -> None:
    """Switches TensorFlow to tf.compat.v1 graph mode; hides deprecation noise unless verbose.

    SyncReplicasOptimizer, QueueRunner, Supervisor and replica_device_setter are all deprecated
    tf.compat.v1 APIs; their warnings are expected and say nothing useful to a user.
    """
    with contextlib.nullcontext() if verbose else _stderr_silenced():
        import tensorflow as tf
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
