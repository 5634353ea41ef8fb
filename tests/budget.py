"""The test suite's CPU budget, per tier: `make test` loads this plugin (`-p tests.budget
--cpu-budget`), and fails when a tier's tests took more CPU than the tier's budget, naming its
costliest tests, so that the suite's growth is caught before it costs `make test`'s bound.

CPU, not wall time: on a shared, noisy machine the CPU a test costs moves far less than the time
it waits. A test's CPU is its pytest process's (RUSAGE_SELF: the test's own threads, and the
in-process TensorFlow servers it runs) plus that of the processes it started and waited for
(RUSAGE_CHILDREN: tasks, launchers, a test's process of its own), from its setup to its
teardown. Each pytest-xdist process measures its own tests; the report carries the figure
(`user_properties`) to the process that sums it.
"""

from __future__ import annotations

import collections
import resource

import pytest

# CPU seconds a tier's tests may take under `make test`: each tier's sum as measured on this
# project's 2-core machine in six fresh-clone runs on 7 December 2026 (fast 38 to 47.6 s,
# inprocess 204 to 236 s, cluster 244 to 311 s; the CPU shared in some), and about 20% more
# than the largest, for the noise of a shared host.
BUDGETS = {"fast": 57.0, "inprocess": 285.0, "cluster": 375.0}
COSTLIEST = 8  # tests named when a tier is over its budget
_KEY = "cpu_s"


def pytest_addoption(parser):
    parser.addoption("--cpu-budget", action="store_true",
                     help="fail when a tier's tests take more CPU than its budget "
                          "(tests/budget.py)")


def _cpu() -> float:
    own, children = (resource.getrusage(who) for who in
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_started = pytest.StashKey[float]()  # a test's CPU at its setup


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "setup":
        item.stash[_started] = _cpu()
    elif call.when == "teardown" and _started in item.stash:
        item.user_properties.append((_KEY, _cpu() - item.stash[_started]))
    yield


class _Tally:
    def __init__(self, budgets: dict[str, float]):
        self.budgets = budgets
        self.cpu = collections.defaultdict(dict)  # tier: {nodeid: CPU s}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        for key, value in report.user_properties:
            if key == _KEY and report.when == "teardown":
                tier = _tier(report.nodeid)
                self.cpu[tier][report.nodeid] = self.cpu[tier].get(report.nodeid, 0.0) + value

    def over(self) -> list[str]:
        """One line per tier over its budget, naming its costliest tests."""
        lines = []
        for tier, tests in sorted(self.cpu.items()):
            budget, total = self.budgets.get(tier), sum(tests.values())
            if budget is None or total <= budget:
                continue
            costliest = sorted(tests.items(), key=lambda kv: -kv[1])[:COSTLIEST]
            lines.append(f"the {tier} tier took {total:.1f} s of CPU, over its budget of "
                         f"{budget:g} s (tests/budget.py); its costliest tests: " +
                         ", ".join(f"{nodeid} {cpu:.1f} s" for nodeid, cpu in costliest))
        return lines

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        if not self.cpu:
            return
        terminalreporter.write_line("CPU by tier: " + ", ".join(
            f"{tier} {sum(tests.values()):.1f} s of {self.budgets.get(tier, '-')}"
            for tier, tests in sorted(self.cpu.items())))
        for line in self.over():
            terminalreporter.write_line(f"over budget: {line}", red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.over() and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _tier(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_configure(config):
    # In an xdist worker the reports go to the controlling process, which tallies them.
    if config.getoption("--cpu-budget") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Tally(BUDGETS), "cpu-budget-tally")
