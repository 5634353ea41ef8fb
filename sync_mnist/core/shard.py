"""A worker's shard of in-memory training data, and the error bad data raises.

Sync: every worker cuts the same permutation into equal parts, so every worker runs the same
number of batches and no example is in two shards. This module imports only numpy (and
coverage.py, pure).
"""

from __future__ import annotations

import numpy as np

from sync_mnist.core import coverage
from sync_mnist.core.coverage import COUNTED_PASSES


class DataError(Exception):
    """Data is missing, malformed or inconsistent; the message names the file or value."""


def check_ids(ids, feature: str, bound: int, where: str) -> None:
    """Raises DataError naming an id of --count-examples outside 0 to bound - 1."""
    ids = np.asarray(ids)
    outside = ids[(ids < 0) | (ids >= bound)]
    if outside.size:
        raise DataError(f"--count-examples {feature}: {where} has id {outside.flat[0]}, outside "
                        f"0-{bound - 1:,} (--count-examples-ids {bound:,}): number the ids from "
                        "0, or raise --count-examples-ids")


def check_pass(passed: int, feature: str, where: str) -> None:
    """Raises DataError where --count-examples cannot tell pass `passed` (from 0) apart."""
    if passed >= COUNTED_PASSES:
        raise DataError(f"--count-examples {feature}: {where} is of pass {passed + 1}, and the "
                        f"counts tell up to {COUNTED_PASSES} passes apart: give fewer "
                        "--train-steps, or leave out --count-examples")


class Shard:
    """Worker `index` of `num_workers`: a disjoint, equal-length slice of the training set.

    `images` may be any features: one numpy array, or a dict of them, all indexed along their
    first axis like the labels (a model's train_input_fn returns them: sync_mnist.api).

    All workers permute the training indices with the same `seed` and cut the result
    into `num_workers` equal contiguous parts (the remainder of n / num_workers is
    dropped), so shards never overlap. The shard copies its own rows, so the full
    training set can be dropped once it is made. Each epoch visits the shard in a fresh
    order drawn from (seed, epoch, index). The last partial batch is dropped, so every
    worker runs the same number of batches per epoch.

    Args:
        images: training features, indexed along the first axis; or a dict of such arrays.
        labels: training labels, same length.
        index: this worker's index, 0..num_workers-1.
        num_workers: number of workers sharing the data.
        batch_size: examples per batch.
        seed: non-negative; must be the same on every worker.

    Raises:
        DataError: inconsistent arguments, or a batch larger than the shard.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        index: int,
        num_workers: int,
        batch_size: int,
        seed: int,
    ) -> None:
        columns = images if isinstance(images, dict) else {"": images}
        for name, column in columns.items():
            if len(column) != len(labels):
                raise DataError(f"{len(column)} {f'rows of features[{name!r}]' if name else 'images'}"
                                f" but {len(labels)} labels")
        if num_workers < 1:
            raise DataError(f"num_workers must be at least 1, got {num_workers}")
        if not 0 <= index < num_workers:
            raise DataError(
                f"worker index {index} is outside the cluster "
                f"({num_workers} workers: 0-{num_workers - 1})"
            )
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, got {batch_size}")
        if seed < 0:
            raise DataError(f"shard seed must be non-negative, got {seed}")
        n = len(labels)
        size = n // num_workers
        if batch_size > size:
            raise DataError(
                f"batch size {batch_size} is larger than worker {index}'s shard of "
                f"{size} examples ({n} examples / {num_workers} workers)"
            )
        self._index = index
        self._seed = seed
        # For the data verdict: one source, the examples given, cut in num_workers parts.
        self.plan = coverage.Plan("in memory, by the package",
                                  {f"<the {n:,} examples of its input function>":
                                   (index, num_workers)})
        self._batch_size = batch_size
        partition = np.random.default_rng(seed).permutation(n)
        self._indices = partition[index * size : (index + 1) * size]
        self._indices.flags.writeable = False
        # A copy: only this worker's rows.
        self._images = ({k: v[self._indices] for k, v in images.items()}
                        if isinstance(images, dict) else images[self._indices])
        self._labels = labels[self._indices]
        self._cached_epoch: tuple[int, np.ndarray] | None = None

    @property
    def size(self) -> int:
        """Examples in this worker's shard."""
        return len(self._indices)

    @property
    def batches_per_epoch(self) -> int:
        """Full batches per pass over the shard; equal on every worker."""
        return self.size // self._batch_size

    @property
    def indices(self) -> np.ndarray:
        """The shard's example indices into the full training set (read-only)."""
        return self._indices

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The shard's example indices (into the full training set) in the order `epoch`
        visits them."""
        return self._indices[self._epoch_positions(epoch)]

    def _epoch_positions(self, epoch: int) -> np.ndarray:
        if self._cached_epoch is None or self._cached_epoch[0] != epoch:
            rng = np.random.default_rng([self._seed, epoch, self._index])
            self._cached_epoch = (epoch, rng.permutation(self.size))
        return self._cached_epoch[1]

    def ends_after(self, step: int) -> bool:
        """Never: the shard repeats, and the run's length is known (core/stream.py's end)."""
        return False

    def position(self) -> None:
        """None: a batch is a pure function of its step, found without reading (Stream's has
        a position to save)."""
        return None

    def resume_from(self, blobs) -> None:
        """Nothing to resume: see position()."""

    def pass_of(self, step: int) -> int:
        """The pass (from 0) that batch `step` belongs to."""
        return step // self.batches_per_epoch

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns the batch for global step `step`: its features (as stored) and labels.

        A pure function of `step` (the cache only saves recomputing an epoch's order),
        so a worker resuming at step k gets the batch it would have had.

        Args:
            step: a non-negative step count.

        Returns:
            `batch_size` rows of the features (an array, or a dict of arrays) and labels.
        """
        if step < 0:
            raise DataError(f"step must be non-negative, got {step}")
        epoch, position = divmod(step, self.batches_per_epoch)
        start = position * self._batch_size
        chosen = self._epoch_positions(epoch)[start : start + self._batch_size]
        features = ({k: v[chosen] for k, v in self._images.items()}
                    if isinstance(self._images, dict) else self._images[chosen])
        return features, self._labels[chosen]
