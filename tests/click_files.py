"""A few clicks of the SMALL click model written to files, for the click-file tests of every
tier (sync_mnist/models/clickwriter.py)."""

from __future__ import annotations

from pathlib import Path

from sync_mnist.models import clickwriter, ctr

SMALL = "sync_mnist.models.ctr:SMALL"
# A few clicks of the SMALL model, another seed than the default.
PARAMS = {**ctr.SMALL.params, "seed": 5, "shuffle_buffer": 0}


def write(out: Path, kind: str, compress: bool = False, train: int = 300, files: int = 3):
    return clickwriter.write(out, PARAMS, model=SMALL, kind=kind, compress=compress,
                          train_examples=train, eval_examples=120, train_files=files,
                          eval_files=1)


def params(directory: Path) -> dict:
    """PARAMS, reading the files in `directory` (--data-dir)."""
    return {**PARAMS, "data_dir": str(directory)}
