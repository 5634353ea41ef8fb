"""The container tier (`make test-container`): prints what it measured at the end of the run."""

from __future__ import annotations

import podman_cluster


def pytest_terminal_summary(terminalreporter):
    if podman_cluster.FIGURES:
        terminalreporter.section("measured here")
        for name, value in podman_cluster.FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
