"""core/stream.py: a worker's share of a tf.data input, read in a local session; batch(step) a
pure function of the update number, cut by file or by record, its end seen one batch ahead."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import stream_model
from sync_mnist.core.shard import DataError
from sync_mnist.core.stream import Stream

tf1 = tf.compat.v1


def _stream(files, *, index=0, num_workers=2, batch_size=4, epochs=1, shuffle=False,
            make=None) -> Stream:
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        dataset = make() if make else tf.data.TFRecordDataset(
            [str(f) for f in files]).map(stream_model._parse)
        if shuffle:
            dataset = dataset.shuffle(16)
    return Stream(graph, dataset, index=index, num_workers=num_workers, batch_size=batch_size,
                  epochs=epochs, sharded=False, what="train_input_fn")


def _ids(stream: Stream, start: int = 0) -> list[list[int]]:
    out, step = [], start
    while True:
        features, _ = stream.batch(step)
        out.append(features["id"].tolist())
        if stream.ends_after(step):
            return out
        step += 1


def test_at_least_as_many_files_as_workers_are_cut_by_file(tmp_path):
    files = stream_model.write(tmp_path, [12, 8, 12, 9])  # ids 0-11, 12-19, 20-31, 32-40
    first, second = _stream(files, index=0), _stream(files, index=1)
    assert first.sharding == second.sharding == "by file"
    # Worker 0 reads files 0 and 2, worker 1 files 1 and 3 (its last id, 40, is the remainder).
    assert sum(_ids(first), []) == [*range(0, 12), *range(20, 32)]
    assert sum(_ids(second), []) == [*range(12, 20), *range(32, 40)]


def test_fewer_files_than_workers_are_cut_by_record(tmp_path):
    files = stream_model.write(tmp_path, [20])
    streams = [_stream(files, index=i, num_workers=2, batch_size=2) for i in (0, 1)]
    assert {s.sharding for s in streams} == {"by record"}
    assert sum(_ids(streams[0]), []) == list(range(0, 20, 2))
    assert sum(_ids(streams[1]), []) == list(range(1, 20, 2))


def test_a_batch_is_a_pure_function_of_its_step_through_a_restart(tmp_path):
    """A worker restarted at update k starts its stream there: the batches it would have had,
    shuffled the same (the input graph's seed), none of those before k again."""
    files = stream_model.write(tmp_path, [10, 10, 10, 10])
    whole = _ids(_stream(files, shuffle=True, epochs=2))
    assert len(whole) == 10  # 2 passes over 20 examples, 4 a batch, remainders dropped
    assert sorted(sum(whole[:5], [])) == sorted(sum(whole[5:], [])) != sum(whole[:5], [])
    restarted = _stream(files, shuffle=True, epochs=2)
    assert _ids(restarted, start=6) == whole[6:]
    # And back: a step redone (the ps restored from a checkpoint) gets its batch again.
    assert restarted.batch(3)[0]["id"].tolist() == whole[3]
    assert restarted.batch(4)[0]["id"].tolist() == whole[4]


def test_the_end_is_seen_one_batch_ahead(tmp_path):
    stream = _stream(stream_model.write(tmp_path, [9, 8]), batch_size=4, epochs=1)
    stream.batch(0)
    assert not stream.ends_after(0)
    stream.batch(1)
    assert stream.ends_after(1)  # 9 examples: two batches, one left over
    with pytest.raises(DataError, match="has no batch 2: it ended before it"):
        stream.batch(2)


def test_a_stream_without_end_and_other_shapes_are_refused(tmp_path):
    files = stream_model.write(tmp_path, [8, 8])
    with pytest.raises(DataError, match="repeats without end: drop its .repeat"):
        _stream(files, make=lambda: tf.data.TFRecordDataset([str(f) for f in files]).map(
            stream_model._parse).repeat())
    with pytest.raises(DataError, match="yields .*not pairs"):
        _stream(files, make=lambda: tf.data.Dataset.range(8))
    with pytest.raises(DataError, match=r"no full batch of 4 examples for worker 1 of 2"):
        _stream(files, index=1, make=lambda: tf.data.Dataset.from_tensor_slices(
            ({"x": np.zeros((5, 2), np.float32)}, np.zeros(5, np.int64))))


def test_variable_length_features_come_as_sparse_values(tmp_path):
    def make():
        ids = tf.ragged.constant([[1], [2, 3], [4, 5, 6], [7]], tf.int64).to_sparse()
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, tf.constant([0, 1, 0, 1])))

    features, labels = _stream([], make=make, num_workers=1, batch_size=2).batch(1)
    assert isinstance(features["ids"], tf1.SparseTensorValue)
    assert features["ids"].values.tolist() == [4, 5, 6, 7]
    assert labels.tolist() == [0, 1]


def test_a_corrupt_record_is_bad_data_before_training(tmp_path):
    files = stream_model.write(tmp_path, [8, 8])
    data = bytearray(files[1].read_bytes())
    data[40] ^= 0xFF  # inside the first record: its checksum no longer matches
    files[1].write_bytes(bytes(data))
    with pytest.raises(DataError) as raised:
        _stream(files, index=0, batch_size=2)  # worker 1's first batch is in that file
    assert str(raised.value) == ("train_input_fn: reading the first batch of worker 1's files: "
                                 "DataLossError: corrupted record at 12")
