"""`sync-mnist plot LOGDIR`: a finished run's synchrony as a picture.

Reads the summaries the chief wrote with --logdir (metrics.write_summaries: the ps-side counters
and the loss, every --log-every local steps and once at the end) and draws, against
global_step, each worker's contributions (its gradients that some update averaged) above the
loss. In a synchronous run with R = N every worker contributes one gradient to every update,
so the workers' lines lie on top of each other, on the diagonal; in the question's replay the
chief's line climbs three times as fast and the others stay at 0.

matplotlib is an optional dependency (`pip install 'sync_mnist[plot]'`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

_ACCEPTED = re.compile(r"^sync/accepted/worker(\d+)$")
MISSING_MATPLOTLIB = ("sync-mnist plot needs matplotlib, which is not installed: "
                      "pip install 'sync_mnist[plot]' (or: pip install matplotlib)")


class PlotError(ValueError):
    """The run cannot be drawn: no summaries, or matplotlib is missing."""


@dataclasses.dataclass
class Series:
    """What the picture shows, as read from the summaries: (global_step, value) pairs."""
    logdir: Path
    contributions: dict[int, list[tuple[int, float]]]  # worker index -> its accepted gradients
    loss: list[tuple[int, float]]
    test_accuracy: float | None = None

    @property
    def final_step(self) -> int:
        return max(step for points in self.contributions.values() for step, _ in points)

    @property
    def final_contributions(self) -> list[int]:
        """Each worker's last plotted value: the counters at the end of the run."""
        return [int(self.contributions[w][-1][1]) for w in sorted(self.contributions)]


def events_files(logdir: Path) -> list[Path]:
    """The events files in `logdir`, oldest first (no TensorFlow needed). Raises PlotError."""
    logdir = Path(logdir)
    files = sorted(logdir.glob("events.out.tfevents.*"))
    if not files:
        raise PlotError(f"{logdir} holds no events files (the chief writes them with "
                        f"--logdir {logdir})")
    return files


def load(logdir: Path) -> Series:
    """Reads every events file in `logdir` (oldest first; a later value for the same tag and
    step wins, as the final reading repeats the last step's). Raises PlotError."""
    import tensorflow as tf  # imported late: TensorFlow is slow to load
    from google.protobuf.message import DecodeError

    logdir = Path(logdir)
    scalars: dict[str, dict[int, float]] = {}
    for path in events_files(logdir):
        try:
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        scalars.setdefault(value.tag, {})[event.step] = value.simple_value
        except (tf.errors.OpError, DecodeError) as e:  # a chief killed mid-write, a stray file
            reason = (getattr(e, "message", None) or str(e) or type(e).__name__).splitlines()[0]
            raise PlotError(f"{path} is not a readable events file: {reason}") from None
    contributions = {int(m[1]): sorted(points.items()) for tag, points in scalars.items()
                     if (m := _ACCEPTED.match(tag))}
    if not contributions:
        raise PlotError(f"{logdir} holds no sync/accepted/worker* summaries: it is not the "
                        "--logdir of a sync-mnist run, or the run ended before its first "
                        "--log-every steps")
    accuracy = scalars.get("test_accuracy")
    return Series(logdir=logdir, contributions=contributions,
                  loss=sorted(scalars.get("loss", {}).items()),
                  test_accuracy=accuracy[max(accuracy)] if accuracy else None)


def draw(series: Series, title: str | None = None):
    """The picture, as a matplotlib Figure: contributions per worker above, the loss below."""
    fig = require_matplotlib()(figsize=(6.4, 4.8), dpi=100)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    last = series.final_step
    top.plot([0, last], [0, last], color="0.6", linestyle="--", linewidth=1,
             label="one gradient per update")
    # Thinner lines on top of thicker ones, so that workers with equal counts all show.
    widths = [7, 4, 1.5]
    for w in sorted(series.contributions):
        steps, values = zip(*series.contributions[w])
        top.plot(steps, values, linewidth=widths[w % len(widths)], marker=".",
                 label=f"worker {w}{' (chief)' if w == 0 else ''}")
    top.set_ylabel("contributions\n(gradients averaged)")
    top.legend(loc="upper left", fontsize="small")
    top.grid(alpha=0.3)
    accuracy = ("" if series.test_accuracy is None
                else f", test accuracy {series.test_accuracy:.3f}")
    top.set_title(f"{title or series.logdir.name}\ncontributions {series.final_contributions} "
                  f"at global_step {last}{accuracy}", fontsize="medium")
    if series.loss:
        steps, values = zip(*series.loss)
        bottom.plot(steps, values, color="black", marker=".", linewidth=1)
    bottom.set_ylabel("loss (chief)")
    bottom.set_xlabel("global_step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def require_matplotlib():
    """matplotlib's Figure class; raises PlotError with what to install if it is missing."""
    try:
        # The object-oriented API, without pyplot: no global state, no display needed.
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(MISSING_MATPLOTLIB) from None
    return Figure


def plot_run(logdir: Path, output: Path, title: str | None = None) -> Series:
    """Draws the run in `logdir` into the PNG `output`; returns the series it plotted."""
    require_matplotlib()  # before reading anything
    series = load(logdir)
    fig = draw(series, title)
    output = Path(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(output, format="png")
    except OSError as e:
        raise PlotError(f"cannot write {output}: {e.strerror or e}") from None
    return series
