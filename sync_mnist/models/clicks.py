"""The click model's generated clicks: the planted model and the clicks it draws, in memory
(models/ctr.py's input functions) or a chunk at a time (models/clickwriter.py writes them as
a click log). ctr.py's docstring tells the law they follow.

This module imports only numpy and the standard library.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

IDS = "ids"  # int64 [n, fields]: the raw ids, one column per field
PLANTED = "planted_probability"  # float32 [n]: the generator's own probability of a click


@dataclasses.dataclass(frozen=True)
class Clicks:
    ids: np.ndarray  # int64 [n, fields]
    labels: np.ndarray  # float32 [n], 0 or 1
    planted: np.ndarray  # float32 [n]: sigmoid of the planted logit

    def features(self) -> dict:
        return {IDS: self.ids, PLANTED: self.planted}

    def planted_log_loss(self) -> float:
        p = np.clip(self.planted.astype(np.float64), 1e-7, 1 - 1e-7)
        y = self.labels
        return float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))


@functools.lru_cache(maxsize=4)
def planted_weights(fields: int, vocabulary: int, weight_scale: float, seed: int) -> np.ndarray:
    """float64 [fields, vocabulary]: the planted weight of each (field, id)."""
    return np.random.default_rng([seed, 1]).normal(0, weight_scale, (fields, vocabulary))


def generate(params, examples: int, part: int) -> Clicks:
    """`examples` clicks drawn from the planted model of `params`; `part` 0 for the training
    set, 1 for the evaluation set (another stream of the same seed, the same planted model).

    Field f's id of rank k (0 the most frequent) is k: P(k) ~ (k + 1)**-zipf over the
    vocabulary; each field draws its own ids. Deterministic in params["seed"].
    """
    return next(generate_chunks(params, examples, part, chunk=max(examples, 1)))


def generate_chunks(params, examples: int, part: int, chunk: int):
    """The clicks of generate(params, examples, part), in that order, `chunk` at a time (the
    last may be shorter): the same numbers whatever the chunk, so that files larger than memory
    hold exactly the clicks a run draws in memory (clickwriter.py writes them)."""
    fields, vocabulary = params["fields"], params["vocabulary"]
    weights = planted_weights(fields, vocabulary, params["weight_scale"], params["seed"])
    # Two generators on one stream: the ids take its first examples * fields draws and the
    # labels the next examples (generate drew them so, in one piece); advance() jumps there.
    ids_rng = np.random.default_rng([params["seed"], 2, part])
    labels_rng = np.random.default_rng([params["seed"], 2, part])
    labels_rng.bit_generator.advance(examples * fields)  # one 64-bit draw per float64
    cumulative = np.cumsum(np.arange(1, vocabulary + 1, dtype=np.float64) ** -params["zipf"])
    cumulative /= cumulative[-1]
    for start in range(0, max(examples, 1), chunk):
        n = min(chunk, examples - start)
        ids = np.searchsorted(cumulative, ids_rng.random((n, fields)), side="right")
        ids = np.minimum(ids, vocabulary - 1).astype(np.int64)
        logit = params["bias"] + weights[np.arange(fields), ids].sum(axis=1)
        planted = 1 / (1 + np.exp(-logit))
        labels = (labels_rng.random(n) < planted).astype(np.float32)
        yield Clicks(ids, labels, planted.astype(np.float32))
