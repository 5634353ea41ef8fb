"""A call that must end by itself: run in a thread, failed if it still waits after GUARD s
(for the tests of every wait's bound: tests/recovery/test_bounds.py, test_library_form.py)."""

from __future__ import annotations

import threading
import time

GUARD = 30.0  # past this, the wait is taken to be without a bound


def within_guard(call):
    """Runs call() in a thread; returns (its exception or None, seconds), or fails after
    GUARD s."""
    outcome = {}

    def run():
        started = time.monotonic()
        try:
            call()
        except BaseException as e:  # reported to the caller
            outcome["error"] = e
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), f"still waiting after {GUARD:g} s: the wait has no bound"
    return outcome.get("error"), outcome["seconds"]
