"""What a growing table's admission and eviction cost the ps in each update, against its cap.

    python -m lab.growing_cost [--cap 10000 100000 1000000] [--updates 200] [--dim 16]

One ps's part of one update, in this process, on the real ops (core/growing.py's decide and
write, after the apply): the update's ids as the chief's take hands them over (distinct,
sorted, with their counts), here the ids of 3 workers' batches of 100 clicks of 26 fields,
drawn from a Zipf law (exponent 1.1, unbounded: ever new ids, as on an endless log), then
min_count 2, ttl 100 updates, an Adagrad accumulator reset with each evicted row. Prints, for
each cap, the mean milliseconds an update's maintenance took over the last half of the
updates (the first half fills the table), the rows held at the end and the ids waiting for a
row. The gradient's apply, the same as a fixed table's, is not in it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def measure(cap: int, updates: int, dim: int, seed: int = 0) -> dict:
    import tensorflow as tf

    from sync_mnist.core import growing

    tf1 = tf.compat.v1
    settings = growing.Settings("grow", dim, cap, min_count=2, ttl=100)
    rng = np.random.default_rng(seed)
    with tf.Graph().as_default() as graph, tf1.device("/cpu:0"):
        growing.lookup(tf1.placeholder(tf.int64, [None]), settings, tf1.zeros_initializer())
        shard = growing.tables(graph)[0].shards[0]
        accumulator = tf1.get_variable("grow/rows/Adagrad", [cap, dim],
                                       initializer=tf1.constant_initializer(0.1))
        ids, counts = tf1.placeholder(tf.int64, [None]), tf1.placeholder(tf.int64, [None])
        now = tf1.placeholder(tf.int64, [])
        decided = growing._decide(shard, settings, ids, counts, now)  # pylint: disable=W0212
        update = growing._write(shard, settings, decided, now, [accumulator])  # noqa (W0212)
        held = tf.reduce_sum(tf.cast(shard.seen >= 0, tf.int64))
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            took = []
            for t in range(1, updates + 1):
                batch = rng.zipf(1.1, 3 * 100 * 26) * 7919 + rng.integers(0, 7919)
                distinct, n = np.unique(batch, return_counts=True)
                start = time.perf_counter()
                sess.run(update, {ids: distinct, counts: n, now: t})
                took.append(time.perf_counter() - start)
            return {"cap": cap, "ms": 1000 * float(np.mean(took[updates // 2:])),
                    "held": int(sess.run(held)), "waiting": int(sess.run(shard.pending.size()))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                        help="rows of the table (one ps's part); default 10000 100000 1000000")
    parser.add_argument("--updates", type=int, default=200, help="updates to run; default 200")
    parser.add_argument("--dim", type=int, default=16, help="floats a row; default 16")
    args = parser.parse_args(argv)
    from sync_mnist.core import tfcompat
    tfcompat.graph_mode(verbose=False)
    for cap in args.cap:
        r = measure(cap, args.updates, args.dim)
        print(f"cap={r['cap']:,} maintenance={r['ms']:.1f} ms/update held={r['held']:,} "
              f"waiting={r['waiting']:,}", flush=True)


if __name__ == "__main__":
    main()
