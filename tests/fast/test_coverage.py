"""core/coverage.py: the data verdict's arithmetic, from the workers' plans and the ps's
accepted counters alone."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sync_mnist.core.coverage import WHOLE, DataVerdict, Plan, judge, judge_ids, with_ids

CUT = "by file, by the package"


def test_files_each_read_whole_by_one_worker_are_covered_once():
    plans = [Plan(CUT, {"/d/f0": WHOLE, "/d/f2": WHOLE}, ("/d/f0", "/d/f1", "/d/f2", "/d/f3")),
             Plan(CUT, {"/d/f1": WHOLE, "/d/f3": WHOLE}, ("/d/f0", "/d/f1", "/d/f2", "/d/f3"))]
    verdict = judge(plans, [7, 5], 10)
    assert verdict.covered is True
    assert verdict.line == ("each of 4 files read whole by exactly one worker, covered once (cut "
                            "by file, by the package); 120 examples used in applied updates "
                            "(70, 50 a worker)")


def test_a_file_read_twice_and_files_read_by_none_are_named_with_their_workers():
    listed = tuple(f"/d/f{i}" for i in range(6))
    plans = [Plan(CUT, {"/d/f0": WHOLE}, listed), Plan(CUT, {"/d/f0": WHOLE}, listed)]
    verdict = judge(plans, [1, 1], 4)
    assert verdict.covered is False
    assert verdict.line == ("NOT covered once: 1 file read by worker 0 (whole), worker 1 (whole) "
                            "(f0); 5 files read by no worker (f1, f2, f3 and 2 more) (cut by "
                            "file, by the package); 8 examples used in applied updates (4, 4 a "
                            "worker)")


def test_parts_cover_a_source_only_when_they_are_every_part_of_one_cut_once():
    rows = "<the 600 examples of its input function>"
    assert judge([Plan("m", {rows: (0, 2)}), Plan("m", {rows: (1, 2)})], [1, 1], 1) == DataVerdict(
        True, "the 600 examples of its input function, cut into 2 disjoint parts, one a worker, "
              "covered once (cut m); 2 examples used in applied updates (1, 1 a worker)")
    for parts in ([(0, 2), (0, 2)], [(0, 3), (1, 3)], [(0, 2), (1, 3)], [WHOLE, (1, 2)]):
        verdict = judge([Plan("m", {rows: p}) for p in parts], [1, 1], 1)
        assert verdict.covered is False, parts
        assert verdict.line.startswith("NOT covered once: 1 input read by worker 0 ("), parts


def test_workers_that_cut_differently_or_did_not_say_are_not_covered_or_not_proved():
    mixed = judge([Plan(CUT, {"f": WHOLE}), Plan("by record, by the package", {"<r>": (1, 2)})],
                  [2, 2], 1)
    assert mixed.covered is False and mixed.line.startswith(
        "NOT covered once: the workers cut their input differently (worker 0: by file, by the "
        "package; worker 1: by record, by the package)")
    assert judge([Plan(CUT, {"f": WHOLE}), None], [1, 1], 1).line.startswith(
        "not proved: worker 1 published no reading plan")
    unseen = judge([Plan("by the input function (input_context)", {})] * 2, [1, 1], 1)
    assert unseen.covered is None and "cuts its data where the package cannot see" in unseen.line


def test_a_plan_reads_back_as_it_was_written():
    plan = Plan(CUT, {"/d/f0": WHOLE, "<r>": (2, 3)}, ("/d/f0",))
    assert Plan.from_json(plan.to_json()) == plan


def _uses(*passes_of_each_id) -> np.ndarray:
    """example_uses as the ps counts it: an id's uses, and 2**p summed over them."""
    return np.array([[len(ps), sum(2.0 ** p for p in ps)] for ps in passes_of_each_id])


def test_ids_counted_once_for_each_example_used_and_once_a_pass_hold():
    ok, line = judge_ids(_uses([0, 1], [0, 1], [0], [], [1, 0]), "id", 7, most=2)
    assert ok and line == ("ids of id: 4 used: 4 in pass 1, 3 in pass 2; 7 uses, one for each "
                           "example used")
    ok, line = judge_ids(_uses([0, 1, 2], [], [2, 1, 0]), "id", 6, most=3)
    assert ok and line == ("ids of id: each of 2 used exactly once in passes 1-3; 6 uses, one "
                           "for each example used")
    ok, line = judge_ids(_uses([0], [0], []), "id", 2, most=None)
    assert ok and line == "ids of id: each of 2 used exactly once in pass 1; 2 uses, one for " \
        "each example used"


def test_ids_used_twice_in_a_pass_after_the_passes_or_not_counted_are_not_covered():
    # ids 1 and 3 twice in pass 1 and never in pass 2: as many uses as two passes once each
    ok, line = judge_ids(_uses([0, 1], [0, 0], [0, 1], [0, 0]), "id", 8, most=2)
    assert not ok and line == ("NOT each once a pass: ids of id: 4 used: 2 in pass 1, 4 in "
                               "pass 2; 2 ids used twice in one pass (id 1, 3)")
    ok, line = judge_ids(_uses([0, 1], [0], [0, 1], [1], [1]), "id", 7, most=1)
    assert not ok and line.endswith("; 4 ids used after the pass 1 of --epochs 1 (id 0, 2, 3 ...)")
    ok, line = judge_ids(_uses([0], [0]), "id", 3, most=None)
    assert not ok and line.endswith("; 2 uses counted for 3 examples used")
    data = with_ids(judge([Plan("m", {"<r>": (0, 1)})], [3], 1), _uses([0], [0]), "id",
                    [3], 1, None)
    assert data.covered is False and data.line.startswith("r, cut into 1 disjoint parts")


def test_count_examples_is_for_synchronous_runs_of_ids_from_zero_within_a_bound():
    from sync_mnist.core.config import ConfigError, TrainConfig

    assert TrainConfig(epochs=1, count_examples="id").count_examples_ids == 1_000_000
    for kwargs, message in (({"mode": "async"}, "--count-examples id counts uses in the "
                             "synchronous updates: it needs --mode sync"),
                            ({"count_examples_ids": 0}, "--count-examples-ids must be "
                             "1-50,000,000 (two float32 on ps 0 for each), got 0"),
                            ({"epochs": 17}, "--count-examples id tells up to 16 passes "
                             "apart, got --epochs 17"),
                            ({"count_examples": ""}, "--count-examples must name a feature")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            TrainConfig(**{"epochs": 1, "count_examples": "id", **kwargs})


def test_a_batch_of_a_pass_the_counts_cannot_tell_apart_is_bad_input_naming_it():
    from sync_mnist.core.shard import DataError, check_pass

    check_pass(15, "id", "batch 4 of worker 1")  # pass 16: the last told apart
    with pytest.raises(DataError, match=re.escape(
            "--count-examples id: batch 400 of worker 1 is of pass 17, and the counts tell up "
            "to 16 passes apart: give fewer --train-steps, or leave out --count-examples")):
        check_pass(16, "id", "batch 400 of worker 1")
