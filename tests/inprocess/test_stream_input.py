"""core/stream.py: a worker's share of a tf.data input, read in a local session; batch(step) a
pure function of the update number, cut by file or by record, its end seen one batch ahead."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import stream_model
from sync_mnist.core import audit, coverage
from sync_mnist.core.shard import DataError
from sync_mnist.core.stream import Stream, group_size

tf1 = tf.compat.v1


def _stream(files, *, index=0, num_workers=2, batch_size=4, epochs=1, shuffle=False,
            make=None, sharded=False) -> Stream:
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        dataset = make() if make else tf.data.TFRecordDataset(
            [str(f) for f in files]).map(stream_model._parse)
        if shuffle:
            dataset = dataset.shuffle(16)
    return Stream(graph, dataset, index=index, num_workers=num_workers, batch_size=batch_size,
                  epochs=epochs, sharded=sharded, what="train_input_fn")


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
    assert first.sharding == second.sharding == "by file, by the package"
    # Worker 0 reads files 0 and 2, worker 1 files 1 and 3 (its last id, 40, is the remainder).
    assert sum(_ids(first), []) == [*range(0, 12), *range(20, 32)]
    assert sum(_ids(second), []) == [*range(12, 20), *range(32, 40)]
    # What each says it reads, for the data verdict: the files it did read, whole.
    names = [str(f) for f in files]
    assert first.plan.reads == {names[0]: (0, 1), names[2]: (0, 1)}
    assert second.plan.reads == {names[1]: (0, 1), names[3]: (0, 1)}
    assert first.plan.listed == second.plan.listed == tuple(names)
    assert coverage.judge([first.plan, second.plan], [3, 3], 4).covered is True


def test_fewer_files_than_workers_are_cut_by_record(tmp_path):
    files = stream_model.write(tmp_path, [20])
    streams = [_stream(files, index=i, num_workers=2, batch_size=2) for i in (0, 1)]
    assert {s.sharding for s in streams} == {"by record, by the package"}
    assert sum(_ids(streams[0]), []) == list(range(0, 20, 2))
    assert sum(_ids(streams[1]), []) == list(range(1, 20, 2))
    records = "<the records of its 1 file, in its order>"
    assert [s.plan.reads for s in streams] == [{records: (0, 2)}, {records: (1, 2)}]
    assert coverage.judge([s.plan for s in streams], [5, 5], 2).covered is True


def _listed_and_cut(files, index, num_workers, *, shuffled=True):
    """An Estimator-era input: the file names listed, shuffled, and cut by a .shard() of its
    own (by TF_CONFIG, say), then read two at a time."""
    pattern = str(files[0].parent / "*.tfrecord")
    return lambda: tf.data.Dataset.list_files(pattern, shuffle=shuffled, seed=3).shard(
        num_workers, index).interleave(tf.data.TFRecordDataset, cycle_length=2).map(
        stream_model._parse)


def test_an_input_that_cuts_its_files_itself_is_not_cut_again(tmp_path):
    """Cut by file twice, a worker would read a quarter of the data (issue 55): a .shard() of
    the cluster's numbers is the cut, and the plan names the files it lets through."""
    files = stream_model.write(tmp_path, [8, 8, 8, 8, 8, 8])  # ids 0-47, 8 a file
    streams = [_stream(files, index=i, num_workers=3, make=_listed_and_cut(files, i, 3))
               for i in range(3)]
    assert {s.sharding for s in streams} == {"by file, by the input function's .shard()"}
    used = [sorted(sum(_ids(s), [])) for s in streams]
    assert sorted(sum(used, [])) == list(range(48))  # every example, each once
    for stream, ids in zip(streams, used):  # and each worker's are those of the files it names
        assert sorted(stream.plan.reads) == sorted(
            str(files[i // 8]) for i in ids[::8])
    assert coverage.judge([s.plan for s in streams], [4, 4, 4], 4).covered is True


def test_a_shard_of_other_numbers_than_the_cluster_s_is_refused_naming_it(tmp_path):
    files = stream_model.write(tmp_path, [8, 8, 8, 8])
    with pytest.raises(DataError, match=r"train_input_fn's dataset cuts itself with "
                       r"\.shard\(4, 1\) \(ShardDataset\), but this is worker 1 of 3: cut with "
                       r"\.shard\(3, 1\)"):
        _stream(files, index=1, num_workers=3, make=_listed_and_cut(files, 1, 4))
    with pytest.raises(DataError, match=r"\.shard\(3, 0\) .*but this is worker 2 of 3"):
        _stream(files, index=2, num_workers=3, make=_listed_and_cut(files, 0, 3))


def test_an_input_that_takes_input_context_and_reads_every_file_is_found_out(tmp_path):
    """input_context taken and ignored: every worker reads every file whole, which the data
    verdict names, file by file."""
    files = stream_model.write(tmp_path, [8, 8])
    streams = [_stream(files, index=i, sharded=True) for i in (0, 1)]
    assert {s.sharding for s in streams} == {"by the input function (input_context)"}
    assert [sum(_ids(s), []) for s in streams] == [list(range(16))] * 2
    verdict = coverage.judge([s.plan for s in streams], [4, 4], 4)
    assert verdict.covered is False
    assert verdict.line.startswith("NOT covered once: 2 files read by worker 0 (whole), worker 1 "
                                   "(whole) (part-000.tfrecord, part-001.tfrecord)")


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


def test_batches_of_fixed_shapes_are_read_sixteen_a_run_of_the_input_session(tmp_path):
    """A run of the input's session costs about 0.3 ms, whatever it brings (core/stream.py)."""
    files = stream_model.write(tmp_path, [100])
    stream = _stream(files, num_workers=1, batch_size=2)
    runs, run = [], stream._sess.run
    stream._sess.run = lambda *args, **kwargs: runs.append(1) or run(*args, **kwargs)
    ids = _ids(stream)
    assert sum(ids, []) == list(range(100))
    assert len(runs) == 4  # batches 16-31, 32-47, the two left, the end (0-15: when made)
    assert group_size(tf.data.Dataset.from_tensors(({"x": tf.zeros([784])}, 0)).element_spec,
                      100) == 3  # of 1 MiB at most: 100 examples of 3,140 bytes a batch


def test_a_dataset_of_unbatched_blocks_is_cut_into_batches_whole(tmp_path):
    """Examples parsed a block at a time (batch, parse, unbatch: the tf.data guide's
    vectorized parsing) are cut into batches with one copy, not passed one by one, where
    they are cut by file; by record, they are."""
    def make(paths):
        parse = {k: tf.io.FixedLenFeature(v.shape, v.dtype)
                 for k, v in stream_model._FEATURES.items()}
        return lambda: tf.data.TFRecordDataset([str(f) for f in paths]).batch(3).map(
            lambda r: tf.io.parse_example(r, parse)).map(
            lambda e: ({"id": e["id"], "x": e["x"]}, e["label"])).unbatch()

    files = stream_model.write(tmp_path / "four", [12, 8, 12, 9])
    by_file = [_stream(files, index=i, make=make(files)) for i in (0, 1)]
    # As test_at_least_as_many_files_as_workers_are_cut_by_file's, example by example.
    assert [sum(_ids(s), []) for s in by_file] == [[*range(0, 12), *range(20, 32)],
                                                   [*range(12, 20), *range(32, 40)]]
    assert all(_rebatched(s) for s in by_file)
    one = stream_model.write(tmp_path / "one", [20])
    by_record = _stream(one, index=1, batch_size=2, make=make(one))
    assert by_record.sharding == "by record, by the package" and not _rebatched(by_record)
    assert sum(_ids(by_record), []) == list(range(1, 20, 2))


def test_the_input_is_read_without_tf_data_autotuning(tmp_path):
    """Autotuning's thread kept a worker's input from closing for 10 to 27 s at the end of a
    run (core/stream.py's _iterator); every iterator the stream makes has it off."""
    from tensorflow.core.framework import dataset_options_pb2

    files = stream_model.write(tmp_path, [8, 8])
    stream = _stream(files, index=1)  # the first batch of each worker's files, then its own
    made = [op for op in stream._graph.get_operations() if op.type == "MakeIterator"]
    assert len(made) == 3
    for op in made:
        autotune = [dataset_options_pb2.Options.FromString(o.get_attr("serialized_options"))
                    .autotune_options for o in audit.closure([op]) if o.type == "OptionsDataset"]
        assert any(a.HasField("enabled") for a in autotune)
        assert not any(a.enabled for a in autotune if a.HasField("enabled"))


def _rebatched(stream: Stream) -> bool:
    return any(op.type.startswith("RebatchDataset") for op in stream._graph.get_operations())


def test_variable_length_features_come_as_sparse_values(tmp_path):
    def make():
        ids = tf.ragged.constant([[1], [2, 3], [4, 5, 6], [7]], tf.int64).to_sparse()
        return tf.data.Dataset.from_tensor_slices(({"ids": ids}, tf.constant([0, 1, 0, 1])))

    features, labels = _stream([], make=make, num_workers=1, batch_size=2).batch(1)
    assert isinstance(features["ids"], tf1.SparseTensorValue)
    assert features["ids"].values.tolist() == [4, 5, 6, 7]
    assert labels.tolist() == [0, 1]


def _corrupt(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF  # the record's checksum no longer matches
    path.write_bytes(bytes(data))


def _csv_stream(tmp_path, lines: list[str]) -> Stream:
    (tmp_path / "a.csv").write_text("1,0.5,1\n" * 40)  # past the first 16 batches of 2
    (tmp_path / "b.csv").write_text("".join(line + "\n" for line in lines))
    files = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    return _stream([], num_workers=1, batch_size=2, make=lambda: tf.data.TextLineDataset(
        files).map(lambda line: tf.io.decode_csv(line, [[0], [0.0], [0]])).map(
        lambda i, x, y: ({"i": i, "x": x}, y)))


def test_a_corrupt_record_is_bad_data_before_training_naming_its_file(tmp_path):
    files = stream_model.write(tmp_path, [8, 8])
    _corrupt(files[1], 40)  # inside the first record of the second file
    with pytest.raises(DataError) as raised:
        _stream(files, index=0, batch_size=2)  # worker 1's first batch is in that file
    assert str(raised.value) == (
        "train_input_fn: reading the first batch of worker 1's files: DataLossError: corrupted "
        f"record at 12 (in {files[1]}, after 0 of its examples came through the pipeline)")


def test_bad_data_met_mid_stream_names_the_file_and_how_far_it_was_read(tmp_path):
    files = stream_model.write(tmp_path, [40, 40])
    files[1].write_bytes(files[1].read_bytes()[:-30])  # its last record cut short
    stream = _stream(files, num_workers=1, batch_size=2)  # read 16 batches at a time
    with pytest.raises(DataError) as raised:
        for step in range(40):
            stream.batch(step)
    assert step == 31  # the batch after which batches 32-47 are read ahead
    assert "reading batches 32 to 47 of worker 0's input: DataLossError: truncated record " \
           "at" in str(raised.value)
    assert str(raised.value).endswith(
        f"(in {files[1]}, after 39 of its examples came through the pipeline)")


@pytest.mark.parametrize("line, error", [
    ("1,0.5", "Expect 3 fields but have 2 in record"),
    ("1,zero,1", "Field 1 in record 0 is not a valid float: zero")])
def test_a_text_line_that_does_not_parse_is_bad_data_naming_the_file(tmp_path, line, error):
    stream = _csv_stream(tmp_path, ["2,0.5,0", "3,0.5,1", line, "4,0.5,0"])
    with pytest.raises(DataError) as raised:
        for step in range(40):
            stream.batch(step)
    assert f"InvalidArgumentError: {error}" in str(raised.value)
    assert str(raised.value).endswith(
        f"(in {tmp_path / 'b.csv'}, after 2 of its examples came through the pipeline)")


def test_a_batch_of_another_shape_than_the_model_was_built_with_is_bad_data():
    def make():  # examples 0-3 have one value, 4-7 two
        return tf.data.Dataset.range(8).map(lambda i: ({"x": tf.fill([1 + i // 4], 1.0)}, i))

    stream = _stream([], make=make, num_workers=1, batch_size=2)
    stream.batch(0)
    with pytest.raises(DataError) as raised:
        stream.batch(1)  # the batch after it, read ahead, is the first of two values
        stream.batch(2)
    assert str(raised.value) == (
        "train_input_fn: batch 2 of worker 0's input has features['x'] of float32 [2]; the "
        "model was built with float32 [1] (the first batch's)")


def test_no_file_and_a_missing_file_are_bad_data(tmp_path):
    with pytest.raises(DataError, match=r"train_input_fn: making its dataset: "
                                        r"InvalidArgumentError: assertion failed: \[No files "
                                        r"matched pattern: .*nothing-\*.tfrecord\]"):
        _stream([], make=lambda: tf.data.Dataset.list_files(
            str(tmp_path / "nothing-*.tfrecord")).interleave(tf.data.TFRecordDataset).map(
            stream_model._parse))
    with pytest.raises(DataError, match=r"no full batch .*it reads no file that exists: does "
                                        r"its pattern match any\?"):
        _stream([], make=lambda: tf.data.TFRecordDataset(
            tf.io.gfile.glob(str(tmp_path / "nothing-*.tfrecord"))).map(stream_model._parse))
    missing = tmp_path / "missing.tfrecord"
    with pytest.raises(DataError, match=f"NotFoundError: {missing}; No such file or directory"):
        _stream([missing], num_workers=1)


def test_an_evaluation_input_is_read_whole_at_each_evaluation(tmp_path):
    from sync_mnist.core.stream import WholeInput

    files = stream_model.write(tmp_path, [7, 4])
    graph = tf.Graph()
    with graph.as_default():
        dataset = tf.data.TFRecordDataset([str(f) for f in files]).map(stream_model._parse)
    whole = WholeInput(graph, dataset, batch_size=5, what="eval_input_fn")
    for _ in range(2):  # every evaluation reads it all again, the last batch partial
        assert [b[0]["id"].tolist() for b in whole] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10]]


# Fuzzing (tests/fast/test_fuzz.py's property, for streamed files): a damaged file is either
# read (a flipped byte in a float's value parses) or refused as one DataError line naming what
# it read; never another error, never a hang. Each example makes a session: `make test` draws 30
# (the fast profile's 150 took 30 s of CPU), `make soak` its profile's 10,000.
_GOOD = None
_EXAMPLES = 30 if settings.default.max_examples <= 150 else settings.default.max_examples


def _good_records(tmp_path_factory) -> bytes:
    global _GOOD
    if _GOOD is None:
        path = stream_model.write(tmp_path_factory.mktemp("good"), [12])[0]
        _GOOD = path.read_bytes()
    return _GOOD


@settings(max_examples=_EXAMPLES)
@given(damage=st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("text"), st.integers(0, 0), st.binary(max_size=40))))
def test_fuzz_damaged_records_are_read_or_refused_in_one_line(tmp_path_factory, damage):
    kind, at, value = damage
    directory = tmp_path_factory.mktemp("fuzz")
    good = _good_records(tmp_path_factory)
    path = directory / "part-000.tfrecord"
    if kind == "flip":
        data = bytearray(good)
        data[at % len(data)] ^= value
        path.write_bytes(bytes(data))
    elif kind == "cut":
        path.write_bytes(good[:at % len(good)])
    else:
        path.write_bytes(value)
    signal.signal(signal.SIGALRM, _hang)
    signal.alarm(20)
    try:
        stream = _stream([path], num_workers=1, batch_size=2)
        for step in range(6):
            stream.batch(step)
            if stream.ends_after(step):
                break
    except DataError as e:
        assert "\n" not in str(e) and str(e).startswith("train_input_fn"), str(e)
    finally:
        signal.alarm(0)


def _hang(signum, frame):
    raise AssertionError("reading a damaged file ran longer than 20 s: a hang")


def test_a_restart_reads_its_input_from_the_latest_saved_position_not_from_the_start(
        tmp_path, monkeypatch, caplog):
    """Issue 55: the iterator's state, saved every POSITION_EVERY batches (kept on the ps), lets
    a restarted stream read only the batches since; the same batches as a run that never
    stopped, shuffles and all. A position of other files is passed over."""
    from sync_mnist.core import stream as stream_lib

    monkeypatch.setattr(stream_lib, "POSITION_EVERY", 32)
    files = stream_model.write(tmp_path, [200] * 4)  # 100 batches of 4 a worker a pass
    first = _stream(files, shuffle=True, epochs=2)
    whole, blobs = [], []
    for step in range(200):
        whole.append(first.batch(step)[0]["id"].tolist())
        if (blob := first.position()) is not None:
            blobs.append(blob)
    assert [json.loads(b.partition(b"\n")[0])["batch"] for b in blobs] == [32, 64, 96, 128,
                                                                             160, 192]
    restarted = _stream(files, shuffle=True, epochs=2)
    restarted.resume_from(blobs[3:5])  # the ps keeps the last two: 128 and 160
    runs, run = [], restarted._sess.run
    restarted._sess.run = lambda *args, **kwargs: runs.append(1) or run(*args, **kwargs)
    with caplog.at_level("INFO"):
        assert restarted.batch(170)[0]["id"].tolist() == whole[170]
    assert "starting my input at batch 170: from its position saved at batch 160, reading the " \
           "10 batches since" in caplog.text
    assert len(runs) <= 4  # its initialiser, the position, a group or two: not 11 groups
    assert [restarted.batch(s)[0]["id"].tolist() for s in range(171, 200)] == whole[171:]
    # Back to a step before any position this process holds: from the start, as before.
    caplog.clear()
    with caplog.at_level("INFO"):
        assert restarted.batch(20)[0]["id"].tolist() == whole[20]
    assert "starting my input at batch 20 (reading past the batches before it)" in caplog.text
    # The files changed since (one rewritten): the position is not theirs.
    stream_model.write(tmp_path, [200, 200, 200, 199])
    other = _stream(files, shuffle=True, epochs=2)
    with caplog.at_level("INFO"):
        other.resume_from(blobs[3:5])
    assert "passing over my input's position saved at batch 128: it is of another input" \
           in caplog.text
    assert other._positions.before(170) is None


def test_each_batch_knows_its_pass_through_a_restart_across_the_pass_s_end(tmp_path,
                                                                         monkeypatch):
    """--count-examples counts each use by its pass: the stream tags each batch with it, and a
    stream restored from a position in pass 1 tags the batches of pass 2 as such."""
    from sync_mnist.core import stream as stream_lib

    monkeypatch.setattr(stream_lib, "POSITION_EVERY", 16)
    files = stream_model.write(tmp_path, [50] * 4)  # 25 batches of 4 a worker a pass
    first, passes, blobs = _stream(files, shuffle=True, epochs=3), [], []
    for step in range(75):
        first.batch(step)
        passes.append(first.pass_of(step))
        blobs += [b for b in [first.position()] if b is not None]
    assert passes == [0] * 25 + [1] * 25 + [2] * 25 and first.ends_after(74)
    restarted = _stream(files, shuffle=True, epochs=3)
    restarted.resume_from(blobs[:1])  # batch 16, in pass 1
    assert [(restarted.batch(s), restarted.pass_of(s))[1] for s in range(20, 55)] == \
        passes[20:55]
    with pytest.raises(ValueError, match="the pass of batch 3: batch\\(\\) returned 54 last"):
        restarted.pass_of(3)


def test_a_position_is_saved_unless_tf_data_refuses_the_input_s_state(tmp_path, monkeypatch,
                                                                      caplog):
    """The package's own stateful ops keep no state (a block's DeepCopy, a parse's Assert):
    ignored; any other is left to tf.data, and where it refuses to save a state, no position is
    saved and the worker says so once: a restart then reads past the batches before its place."""
    from sync_mnist.core import stream as stream_lib

    ours, other = tf.Graph(), tf.Graph()
    with ours.as_default():
        tf.data.Dataset.range(4).map(lambda x: tf.raw_ops.DeepCopy(x=x))
    with other.as_default():
        v = tf1.get_variable("v", [], tf.int64, use_resource=True)
        tf.data.Dataset.range(4).map(lambda x: x + v.read_value())
    assert [stream_lib._external_state_policy(g) for g in (ours, other)] == [1, 2]

    monkeypatch.setattr(stream_lib, "POSITION_EVERY", 4)
    files = stream_model.write(tmp_path, [256, 256])  # 64 batches a worker
    stream = _stream(files)
    assert stream.position() is not None  # at batch 16, read when it was made
    with stream._graph.as_default():  # a save that tf.data refuses
        stream._positions._save = tf.io.read_file(str(tmp_path / "no such state"))
    with caplog.at_level("INFO"):
        positions = [stream.position() for step in range(32) if stream.batch(step)]
    assert positions == [None] * 32 and stream._positions.before(31) == stream._positions.before(
        16)
    assert caplog.text.count("my input's position cannot be saved (") == 1


def test_a_position_that_cannot_be_restored_is_passed_over_for_the_start(tmp_path, caplog):
    files = stream_model.write(tmp_path, [256, 256])
    whole = [b[0]["id"].tolist() for b in map(_stream(files).batch, range(40))]
    stream = _stream(files)
    bad = json.dumps({"fingerprint": stream._positions.fingerprint, "batch": 32}).encode()
    stream.resume_from([bad + b"\n" + b"not a state"])
    with caplog.at_level("INFO"):
        assert stream.batch(35)[0]["id"].tolist() == whole[35]
    assert "my input's position saved at batch 32 cannot be restored (" in caplog.text
    assert "starting my input at batch 35 (reading past the batches before it)" in caplog.text


def test_a_file_deleted_mid_stream_is_bad_data_naming_that_file_alone(tmp_path):
    """TensorFlow's line names the file that is gone; the package adds no file of its own (its
    search, reading each file alone, found another one before)."""
    files = stream_model.write(tmp_path, [40, 40])
    files[1].unlink()  # after the input listed it (the list is given), before it reads it
    stream = _stream(files, num_workers=1, batch_size=2)
    with pytest.raises(DataError) as raised:
        for step in range(40):
            stream.batch(step)
    assert str(raised.value) == (
        "train_input_fn: reading batches 16 to 31 of worker 0's input: NotFoundError: "
        f"{files[1]}; No such file or directory")
