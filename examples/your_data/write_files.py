"""Writes the example's TFRecord files: 4 classes of 20 features around their centres, in
train-00000-of-00004.tfrecord ... (3,000 examples, files of unequal size) and one eval file.

  python examples/your_data/write_files.py DIRECTORY
"""

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

SIZES = (900, 800, 700, 600)  # examples per training file


def write(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(4, 20))
    labels = rng.integers(0, 4, rows)
    features = centres[labels] + rng.normal(scale=0.5, size=(rows, 20))
    with tf.io.TFRecordWriter(str(path)) as writer:
        for x, label in zip(features, labels):
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())


def main(directory: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for k, rows in enumerate(SIZES):
        write(out / f"train-{k:05d}-of-{len(SIZES):05d}.tfrecord", rows, seed=1 + k)
    write(out / "eval-00000-of-00001.tfrecord", 500, seed=9)
    print(f"wrote {sum(SIZES):,} training and 500 evaluation examples to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: write_files.py DIRECTORY")
    main(sys.argv[1])
