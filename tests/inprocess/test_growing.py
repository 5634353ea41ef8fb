"""A table that grows (api.growing_embedding): ids admitted after min_count sightings,
evicted after ttl updates unseen or beyond the cap, at update boundaries, with exact arithmetic.

An in-process cluster of 2 ps and 3 workers trains 8 updates on batches laid out by hand, so
that rows are admitted, pushed out beyond the cap, lapsed after ttl, and admitted again. The
whole run is replayed in numpy (`_replay`, written from the rules in the docstring of
growing_embedding, not from growing.py) and every row, id, last sighting and Momentum slot of
the checkpoint must equal it exactly: the gradients are multiples of 1/4 and the rates powers
of 2, so no float rounds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import sync_mnist.api as sm
from inprocess_cluster import run_cluster
from sync_mnist.core.shard import Shard

tf1 = tf.compat.v1

WORKERS, PS, BATCH = 3, 2, 4
CAP, DIM, MIN_COUNT, TTL = 4, 2, 2, 2  # 2 rows a ps; even ids on ps 0, odd ids on ps 1
INITIAL, LR, MOMENTUM = 0.5, 0.5, 0.5
ADAGRAD_START = 0.25  # Adagrad's initial accumulator, what an evicted row's goes back to

# SCHEDULE[t - 1][w]: the ids worker w's batch holds for update t (the rest of its 4 ids are
# noise: ids seen once, which never reach min_count). What each update does, by the rules:
SCHEDULE = [
    [[10, 10], [21], []],  # 1: 10 admitted (ps 0 row 0); 21 counts 1
    [[10], [21], [20, 20]],  # 2: 10 trained; 21 admitted (ps 1 row 0), 20 (ps 0 row 1)
    [[10, 20], [21, 30], [30]],  # 3: 10, 20, 21 trained; 30 ready, but ps 0 is full of ids seen now
    [[10], [30], []],  # 4: 30 pushes out 20 (least recently seen) into row 1, reset
    [[30], [41, 41], []],  # 5: 21 lapsed (unseen since 3), its row reset, and 41 takes it
    [[41], [20], [20]],  # 6: 10 lapsed (unseen since 4); 20, counted afresh, takes row 0
    [[20], [], [10]],  # 7: 20 trained; 10 counts 1; 30 lapsed (unseen since 5): row 1 free
    [[], [], []],  # 8: 41 lapsed (unseen since 6): its row reset and free
]
STEPS = len(SCHEDULE)


def _laid_out() -> np.ndarray:
    """The training ids, placed where Shard's permutation puts each worker's batch t."""
    n = WORKERS * BATCH * STEPS
    ids = np.zeros([n, 1], np.int64)
    noise = iter(range(-1001, -10_000, -1))  # negative ids, odd and even: both ps
    for w in range(WORKERS):
        order = Shard(np.zeros([n, 1]), np.zeros(n), index=w, num_workers=WORKERS,
                      batch_size=BATCH, seed=0).epoch_order(0)
        for t, batches in enumerate(SCHEDULE):
            chosen = batches[w] + [next(noise) for _ in range(BATCH - len(batches[w]))]
            ids[order[t * BATCH:(t + 1) * BATCH], 0] = chosen
    return ids


EVAL_IDS = np.array([[10], [20], [21], [30], [41], [999]], np.int64)


COLUMN = "input_layer/grow_growing_embedding/"  # where input_layer makes the column's table


def _model_fn(features, labels, mode, params):
    if params["column"]:  # the feature column form: one id an example, its row
        column = sm.growing_embedding_column(
            "grow", dimension=DIM, cap=CAP, min_count=MIN_COUNT, ttl=TTL,
            initializer=tf1.constant_initializer(INITIAL))
        value = tf.reduce_sum(tf1.feature_column.input_layer({"grow": features}, [column]), 1)
    else:
        rows = sm.growing_embedding(features, name="grow", dim=DIM, cap=CAP,
                                    min_count=MIN_COUNT, ttl=TTL,
                                    initializer=tf1.constant_initializer(INITIAL))
        value = tf.reduce_sum(rows, axis=[1, 2])
    if mode == sm.ModeKeys.PREDICT:
        return sm.ModelSpec(mode, predictions={"value": value})
    # d loss / d row = 3 * count / 4 per worker; their mean over 3 workers: count / 4, exact.
    loss = 3.0 * tf.reduce_mean(value) + 0 * tf.reduce_sum(labels)
    optimizer = tf1.train.AdagradOptimizer(LR, ADAGRAD_START) if params["adagrad"] else \
        tf1.train.MomentumOptimizer(LR, MOMENTUM)
    return sm.ModelSpec(mode, loss=loss, optimizer=optimizer)


def _model(adagrad: bool = False, column: bool = False):
    train = _laid_out()
    return sm.Model(_model_fn, lambda params: (train, np.zeros(len(train), np.float32)),
                    lambda params: (EVAL_IDS, np.zeros(len(EVAL_IDS), np.float32)),
                    params={"adagrad": adagrad, "column": column})


def _momentum(row, slot, g):
    slot = slot * MOMENTUM + g
    return row - LR * slot, slot


def _adagrad(row, slot, g):
    slot = slot + np.float32(g) * np.float32(g)
    return row - np.float32(LR) * np.float32(g) / np.sqrt(slot), slot


def _replay(steps: int = STEPS, apply=_momentum, slot_start=0.0):
    """The run of `steps` updates in numpy: per ps k, rows [cap_k, dim], their optimizer slot, the id each row
    holds and the update that last saw it (-1: free); and what happened, update by update."""
    cap_k = CAP // PS
    rows = np.full([PS, cap_k, DIM], INITIAL)
    slot = np.full([PS, cap_k, DIM], slot_start, np.float32 if apply is _adagrad else float)
    ids = np.zeros([PS, cap_k], np.int64)
    seen = np.full([PS, cap_k], -1, np.int64)
    pending: list[dict] = [{} for _ in range(PS)]  # id -> (sightings, last update seen)
    events = []
    laid = _laid_out()
    batches = [[laid[Shard(np.zeros([len(laid), 1]), np.zeros(len(laid)), index=w,
                           num_workers=WORKERS, batch_size=BATCH, seed=0).epoch_order(0)[
                     t * BATCH:(t + 1) * BATCH], 0] for w in range(WORKERS)]
               for t in range(STEPS)]
    for t in range(1, steps + 1):
        sighted = np.concatenate(batches[t - 1])
        for k in range(PS):
            mine = sighted[sighted % PS == k]
            distinct, counts = np.unique(mine, return_counts=True)
            index = {int(i): r for r, i in enumerate(ids[k]) if seen[k, r] >= 0}
            # The update: each looked-up row's gradient is its count / 4 (mean of 3 workers).
            for i, c in zip(distinct, counts):
                if int(i) in index:
                    r = index[int(i)]
                    rows[k, r], slot[k, r] = apply(rows[k, r], slot[k, r], c / BATCH)
                    seen[k, r] = t
            # Then admission and eviction.
            ready = []
            for i, c in zip(distinct, counts):
                if int(i) in index:
                    continue
                before, last = pending[k].pop(int(i), (0, -1))
                total = (before if last >= 0 and t - last <= TTL else 0) + int(c)
                if total >= MIN_COUNT:
                    ready.append((total, int(i)))
                else:
                    pending[k][int(i)] = (total, t)
            held = seen[k] >= 0
            lapsed = held & (t - seen[k] >= TTL)
            free = ~held | lapsed
            can_go = held & ~lapsed & (seen[k] < t)
            ready.sort(key=lambda p: (-p[0], p[1]))
            n = min(len(ready), int(free.sum() + can_go.sum()))
            for total, i in ready[n:]:
                pending[k][i] = (total, t)
            oldest = sorted(np.flatnonzero(can_go), key=lambda r: (seen[k, r], r))
            evict = lapsed.copy()
            evict[oldest[:max(n - int(free.sum()), 0)]] = True
            for r in np.flatnonzero(evict):
                events.append((t, "lapsed" if lapsed[r] else "pushed out", int(ids[k, r]), k,
                               int(r)))
                rows[k, r], slot[k, r], seen[k, r], ids[k, r] = INITIAL, slot_start, -1, 0
            for (total, i), r in zip(ready[:n], np.flatnonzero(free | evict)):
                events.append((t, "admitted", i, k, int(r)))
                ids[k, r], seen[k, r] = i, t
            for i in [i for i, (_, last) in pending[k].items() if t - last >= TTL]:
                del pending[k][i]
    return rows, slot, ids, seen, events


def test_the_replay_admits_pushes_out_lapses_and_admits_again():
    """The schedule does what its comments say (the replay is the test's reference)."""
    *_, events = _replay()
    assert events == [
        (1, "admitted", 10, 0, 0),
        (2, "admitted", 20, 0, 1), (2, "admitted", 21, 1, 0),
        (4, "pushed out", 20, 0, 1), (4, "admitted", 30, 0, 1),
        (5, "lapsed", 21, 1, 0), (5, "admitted", 41, 1, 0),
        (6, "lapsed", 10, 0, 0), (6, "admitted", 20, 0, 0),
        (7, "lapsed", 30, 0, 1), (8, "lapsed", 41, 1, 0)]


@pytest.mark.parametrize("form", ["function", "column"])
def test_a_growing_table_trains_verified_and_exactly_on_2_ps_and_3_workers(tmp_path, form,
                                                                          capsys):
    """Every variable of the table after 8 updates equals the replay's, bit for bit: the rows
    (an evicted row back at its initial value, a re-admitted one trained afresh), their
    Momentum slots (reset with them), the ids the rows hold and their last sightings; the
    SavedModel answers an id with a row as the trained table does, and any other with zeros;
    and the run is verified synchronous. The same as a feature column in input_layer."""
    logdir, export_dir = tmp_path / "logdir", tmp_path / "export"
    result = run_cluster(WORKERS, _model(column=form == "column"), num_ps=PS,
                         train_steps=STEPS, batch_size=BATCH, logdir=logdir,
                         export_dir=export_dir)
    scope = COLUMN if form == "column" else ""
    assert result.chief.synchronous, result.chief.verdict
    assert result.chief.global_step == STEPS
    rows, slot, ids, seen, _ = _replay()
    reader = tf.train.load_checkpoint(str(logdir))
    np.testing.assert_array_equal(reader.get_tensor(f"{scope}grow/rows"),
                                  rows.reshape(CAP, DIM))
    np.testing.assert_array_equal(reader.get_tensor(f"{scope}grow/rows/Momentum"),
                                  slot.reshape(CAP, DIM))
    np.testing.assert_array_equal(reader.get_tensor(f"{scope}grow/ids"), ids.reshape(CAP))
    np.testing.assert_array_equal(reader.get_tensor(f"{scope}grow/seen"), seen.reshape(CAP))
    # At the end only 20 holds a row (ps 0, row 0); 30's row (ps 0, row 1) was reset.
    assert ids.reshape(CAP)[0] == 20 and seen.reshape(CAP).tolist() == [7, -1, -1, -1]
    assert rows[0, 1].tolist() == [INITIAL, INITIAL] and slot[0, 1].tolist() == [0, 0]
    # The chief's evaluation read the ps's table: only 20 has a row (the others read zeros).
    assert result.chief.test_loss == pytest.approx(3.0 * rows[0, 0].sum() / len(EVAL_IDS))
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING], str(export_dir))
        signature = meta.signature_def["serving_default"]
        value = sess.run(signature.outputs["value"].name,
                         {signature.inputs["features"].name: EVAL_IDS})
    np.testing.assert_array_equal(value, [0, rows[0, 0].sum(), 0, 0, 0, 0])
    # `sync-mnist predict` takes it: a seen id as trained, one it never saw (999) as zeros.
    assert _predicted(export_dir, tmp_path, EVAL_IDS, capsys) == value.tolist()


def _predicted(export_dir, tmp_path, ids, capsys) -> list:
    """The "value" `sync-mnist predict` answers for each row of `ids`, given as JSON lines."""
    from tensorflow.python.eager import context

    from sync_mnist.tools import inference_cli

    lines = tmp_path / "ids.jsonl"
    lines.write_text("".join(json.dumps({"features": row.tolist()}) + "\n" for row in ids))
    capsys.readouterr()
    with context.eager_mode():
        code = inference_cli.main(["predict", "--saved-model", str(export_dir), str(lines)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line)["value"] for line in out.splitlines()]


def test_adagrad_accumulators_are_per_row_and_reset_with_their_row(tmp_path):
    """The same run with Adagrad: each row's accumulator is its own squared gradients from
    its admission (the replay's, to float32 rounding: a square root), and an evicted row's is
    back at the initial accumulator exactly."""
    logdir = tmp_path / "logdir"
    result = run_cluster(WORKERS, _model(adagrad=True), num_ps=PS, train_steps=STEPS,
                         batch_size=BATCH, logdir=logdir)
    assert result.chief.synchronous, result.chief.verdict
    rows, slot, ids, seen, _ = _replay(apply=_adagrad, slot_start=ADAGRAD_START)
    reader = tf.train.load_checkpoint(str(logdir))
    np.testing.assert_allclose(reader.get_tensor("grow/rows"), rows.reshape(CAP, DIM),
                               rtol=1e-6)
    np.testing.assert_allclose(reader.get_tensor("grow/rows/Adagrad"), slot.reshape(CAP, DIM),
                               rtol=1e-6)
    free = seen.reshape(CAP) < 0
    assert (reader.get_tensor("grow/rows/Adagrad")[free] == np.float32(ADAGRAD_START)).all()
    assert (reader.get_tensor("grow/rows")[free] == np.float32(INITIAL)).all()
    np.testing.assert_array_equal(reader.get_tensor("grow/ids"), ids.reshape(CAP))


def test_a_run_resumed_from_its_checkpoint_mid_run_goes_on_as_the_one_that_never_stopped(
        tmp_path):
    """Stopped after update 4 (20 just pushed out, 30 admitted, 21 and the noise waiting with
    their counts) and resumed from the checkpoint for 2 more: the index (id -> row) and the
    counts are saved with the rows, so 30's row is found and trained in update 5 as in the
    replay, and 41 is admitted in the row 21 held."""
    logdir = tmp_path / "logdir"
    first = run_cluster(WORKERS, _model(), num_ps=PS, train_steps=4, batch_size=BATCH,
                        logdir=logdir)
    assert first.chief.synchronous, first.chief.verdict
    resumed = run_cluster(WORKERS, _model(), num_ps=PS, train_steps=6, batch_size=BATCH,
                          logdir=logdir)
    assert resumed.chief.synchronous, resumed.chief.verdict
    assert resumed.chief.global_step == 6
    rows, slot, ids, seen, _ = _replay(6)
    assert ids.reshape(CAP).tolist() == [20, 30, 41, 0] and seen[0, 1] == 5
    reader = tf.train.load_checkpoint(str(logdir))
    np.testing.assert_array_equal(reader.get_tensor("grow/rows"), rows.reshape(CAP, DIM))
    np.testing.assert_array_equal(reader.get_tensor("grow/rows/Momentum"),
                                  slot.reshape(CAP, DIM))
    np.testing.assert_array_equal(reader.get_tensor("grow/ids"), ids.reshape(CAP))
    np.testing.assert_array_equal(reader.get_tensor("grow/seen"), seen.reshape(CAP))


@pytest.mark.parametrize("bad, named", [
    ({"min_count": 0}, "min_count must be an integer of at least 1, got 0"),
    ({"ttl": 0}, "ttl must be an integer of at least 1, got 0"),
    ({"cap": 0}, "cap must be an integer of at least 1, got 0"),
    ({"dim": -2}, "dim must be an integer of at least 1, got -2"),
    ({"cap": 2.5}, "cap must be an integer of at least 1, got 2.5"),
])
def test_bad_settings_are_refused_naming_the_value(bad, named):
    settings = {"name": "grow", "dim": 2, "cap": 4, "min_count": 1, "ttl": None, **bad}
    with tf.Graph().as_default():
        with pytest.raises(sm.ContractError, match=named):
            sm.growing_embedding(tf1.placeholder(tf.int64, [None]), **settings)


def test_float_ids_are_refused():
    with tf.Graph().as_default():
        with pytest.raises(sm.ContractError, match="ids must be an integer tensor, got float32"):
            sm.growing_embedding(tf1.placeholder(tf.float32, [None]), name="grow", dim=2, cap=4)
