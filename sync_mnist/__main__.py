"""`python -m sync_mnist`: one task, as the `sync-mnist` command."""

from sync_mnist.cli import run

run()
