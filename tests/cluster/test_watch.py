"""Watching a run: plain output through a pipe, TensorBoard's reader, and `sync-mnist plot`.

On the two shared whole-cluster runs of conftest.py (synthetic data, a pipe for output): the
fixed setup and the question's, each with --logdir.
"""

from __future__ import annotations

import sys

import pytest

from conftest import SHARED_STEPS as STEPS
from sync_mnist.task import cli
from sync_mnist.tools import plot



@pytest.fixture(scope="module")
def runs(fixed_run, question_run):
    """{setup: (exit code, launcher output, logdir, cluster record)}: the shared runs of the
    fixed setup and the question's (conftest.py), each with --logdir."""
    return {name: (run.code, run.output, run.logdir, run.summary)
            for name, run in (("fixed", fixed_run), ("question", question_run))}


def test_piped_output_is_plain_lines_with_every_tasks_progress(runs):
    code, output, _, record = runs["fixed"]
    assert code == 0, output
    # Not a terminal: no escape codes, no carriage returns, no live line.
    assert "\x1b" not in output and "\r" not in output
    assert "every task's output:" not in output
    # Every worker's progress lines are there, one per --log-every steps, then the verdict.
    for w in range(3):
        assert f"[worker {w}] step={STEPS} global_step={STEPS}/{STEPS} " in output
    assert output.splitlines()[-3:] == [f"verification: {record['verdict']}",
                                        f"data: {record['data_verdict']}",
                                        "exit code 0 (done; in sync mode, verified synchronous)"]


def _assert_contributions_match(series: plot.Series, figure, record: dict) -> None:
    """The lines drawn are the series read, and they end at the ps counters of the record."""
    top = figure.axes[0]
    drawn = {line.get_label(): line for line in top.get_lines()}
    for w, points in series.contributions.items():
        line = drawn[f"worker {w}{' (chief)' if w == 0 else ''}"]
        assert list(line.get_xdata()) == [step for step, _ in points]
        assert list(line.get_ydata()) == [value for _, value in points]
    assert series.final_contributions == record["contributions"]
    assert series.final_step == record["global_step"]
    # Every point is a reading of monotone counters: none ever goes down.
    for points in series.contributions.values():
        values = [value for _, value in points]
        assert values == sorted(values)


def test_plot_of_the_fixed_run_shows_every_worker_on_the_diagonal(runs):
    _, _, logdir, record = runs["fixed"]
    series = plot.load(logdir)
    _assert_contributions_match(series, plot.draw(series), record)
    assert record["contributions"] == [STEPS] * 3
    for points in series.contributions.values():
        assert all(value == step for step, value in points)  # one gradient per update, always
    assert len(series.contributions[0]) >= 3 and len(series.loss) >= 3  # over time


def test_plot_of_the_question_run_shows_the_chief_alone(runs):
    code, output, logdir, record = runs["question"]
    assert code == 3, output
    series = plot.load(logdir)
    _assert_contributions_match(series, plot.draw(series), record)
    steps = record["global_step"]
    assert record["contributions"] == [3 * steps, 0, 0]
    for step, value in series.contributions[0]:
        assert value == 3 * step  # every update: three of the chief's own gradients
    assert all(value == 0 for w in (1, 2) for _, value in series.contributions[w])


@pytest.mark.parametrize("setup", ["fixed", "question"])
def test_plot_command_writes_a_png(runs, setup, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    _, _, logdir, record = runs[setup]
    output = tmp_path / f"{setup}.png"
    assert cli.main(["plot", str(logdir), "-o", str(output)]) == 0
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.imread(str(output)).shape[:2] == (480, 640)
    assert output.stat().st_size < 100_000  # small enough to commit


def test_plot_command_without_summaries_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path} holds no events files (the chief writes them with --logdir "
        f"{tmp_path})")


def test_plot_command_without_matplotlib_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {plot.MISSING_MATPLOTLIB}"


def _write_events(logdir, steps: int = 3):
    """Summaries as the chief writes them (one worker's contributions); the events file."""
    from sync_mnist.core import tfcompat

    tfcompat.graph_mode(verbose=False)  # FileWriter is graph-mode only, as the chief runs
    import tensorflow as tf

    tf1 = tf.compat.v1
    writer = tf1.summary.FileWriter(str(logdir))
    for step in range(1, steps + 1):
        writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(
            tag="sync/accepted/worker0", simple_value=step)]), step)
    writer.close()
    (events,) = logdir.glob("events.out.tfevents.*")
    return events


@pytest.mark.parametrize("damage, reason", [
    ("truncated", "truncated record at "),  # a chief killed mid-write
    ("corrupt", "corrupted record at "),  # a flipped bit: the record's checksum fails
])
def test_plot_command_on_a_damaged_events_file_is_one_error_line(damage, reason, tmp_path,
                                                                 capsys):
    # Before: TensorFlow's DataLossError, a traceback.
    events = _write_events(tmp_path / "run")
    raw = events.read_bytes()
    events.write_bytes(raw[:-5] if damage == "truncated" else
                       raw[:30] + bytes([raw[30] ^ 1]) + raw[31:])
    assert cli.main(["plot", str(tmp_path / "run"), "-o", str(tmp_path / "out.png")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {events} is not a readable events file: {reason}"), line
    assert not (tmp_path / "out.png").exists()


def test_plot_command_checks_its_output_before_reading_the_run(tmp_path, capsys):
    # Before: PermissionError, NotADirectoryError or IsADirectoryError from savefig, a
    # traceback after TensorFlow's start and the whole read.
    _write_events(tmp_path / "run")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-dir").mkdir()
    for output, reason in ((tmp_path / "a-file" / "out.png", "is not writable: Not a directory"),
                           (tmp_path / "a-dir", "is a directory, not a file")):
        assert cli.main(["plot", str(tmp_path / "run"), "-o", str(output)]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: -o {output} {reason}"]
    assert cli.main(["plot", str(tmp_path / "run"), "-o", str(tmp_path / "out.png")]) == 0
    assert (tmp_path / "out.png").stat().st_size > 0


def test_tensorboard_reads_every_tag(runs):
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    _, _, logdir, record = runs["fixed"]
    events = accumulator.EventAccumulator(str(logdir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    workers = range(3)
    assert tags == {"loss", "accuracy", "examples_per_sec", "test_accuracy",
                    "sync/repeat_updates", *(f"sync/accepted/worker{w}" for w in workers),
                    *(f"sync/unused/worker{w}" for w in workers)}
    final = [events.Scalars(f"sync/accepted/worker{w}")[-1] for w in workers]
    assert [int(e.value) for e in final] == record["contributions"]
    assert {e.step for e in final} == {record["global_step"]}
    assert events.Scalars("test_accuracy")[-1].value == pytest.approx(record["test_accuracy"])
    assert [e.value for e in events.Scalars("sync/repeat_updates")] == \
        [0.0] * len(events.Scalars("sync/repeat_updates"))
