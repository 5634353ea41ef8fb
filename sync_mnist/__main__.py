"""`python -m sync_mnist`: one task, as the `sync-mnist` command."""

import sys

from sync_mnist.cli import main

sys.exit(main())
