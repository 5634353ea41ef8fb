"""Shared fixtures. TensorFlow runs in tf.compat.v1 graph mode, as the package does."""

from __future__ import annotations

import os

# Quiet TensorFlow's C++ logs before it is imported, as cli.main does for users.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def pytest_configure(config):
    from sync_mnist import tfcompat

    tfcompat.graph_mode(verbose=False)


import pytest  # noqa: E402


@pytest.fixture
def processes():
    """Starts processes for a test; kills each one's process group when the test ends."""
    from procs import Processes

    procs = Processes()
    try:
        yield procs
    finally:
        procs.kill_all()
