"""A worker's step loop: whether it rejoins by taking a token first, which step each push is
for, and when it stops (sync.rejoin_needed, sync.train_loop). No graph: the steps are stand-ins.

tests/inprocess/test_rejoin.py pins the rejoin down exactly on an in-process cluster.
"""

from __future__ import annotations

import pytest

from sync_mnist.core import sync


# ---------------------------------------------------------------------------- rejoining

@pytest.mark.parametrize("last_push, global_step, waiting, expected", [
    (-1, 0, 0, False),  # a fresh start: push
    (22, 23, 0, False),  # killed before its push for update 24: push it now
    (23, 23, 0, True),  # its push for update 24 is in; the update waits for the others
    (23, 24, 1, True),  # update 24 came; its token is left in the queue
])
def test_rejoin_takes_a_token_first_only_if_the_predecessor_pushed(last_push, global_step,
                                                                   waiting, expected):
    assert sync.rejoin_needed(last_push=last_push, global_step=global_step,
                              tokens_waiting=waiting) is expected


def test_train_loop_follows_the_token_back_after_a_restore():
    # The ps was lost after update 13 and restored from the checkpoint of step 10, so the push
    # meant for update 14 joined update 11.
    tokens = iter([11, 12, 13, 11, 12, 13, 14, 15])
    steps = []

    def run_step(step):
        steps.append(step)
        return next(tokens)

    local = sync.train_loop(run_step, start_step=10, planned=5, target=15, stop_on_token=True)
    assert local == 8
    # Each push trains on the batch of the update it is for, so redone updates see the same data.
    assert steps == [10, 11, 12, 13, 11, 12, 13, 14]


def test_train_loop_in_async_mode_counts_local_steps():
    tokens = iter(range(100, 200, 3))
    steps = []
    local = sync.train_loop(lambda s: steps.append(s) or next(tokens), start_step=4, planned=3,
                            target=5, stop_on_token=False)
    assert (local, steps) == (3, [4, 5, 6])
