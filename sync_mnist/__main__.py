"""`python -m sync_mnist`: one task, as the `sync-mnist` command."""

from sync_mnist.task.cli import run

run()
