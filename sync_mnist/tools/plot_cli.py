"""`sync-mnist plot LOGDIR`: draws a finished run into a PNG (the drawing is plot.py's)."""

from __future__ import annotations

import logging
from pathlib import Path

from sync_mnist.core import config as config_lib
from sync_mnist.task import options


def main(argv: list[str]) -> int:
    """`sync-mnist plot LOGDIR`: draws a finished run into a PNG (see plot.py)."""
    parser = options.Parser(prog="sync-mnist plot", description="Draw a finished run's "
                            "contributions per worker against global_step, and its loss, into "
                            "a PNG, from the summaries the chief wrote with --logdir. Needs "
                            "matplotlib (pip install 'sync_mnist[plot]').")
    parser.add_argument("logdir", type=Path, help="the run's --logdir")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="the PNG to write (default: LOGDIR/synchrony.png)")
    parser.add_argument("--title", default=None,
                        help="the picture's title (default: the name of LOGDIR)")
    args = parser.parse_args(argv)
    options.setup_logging(False, "plot")
    from sync_mnist.tools import plot
    from sync_mnist.task import preflight
    from sync_mnist.core import tfcompat

    output = args.output or args.logdir / "synchrony.png"
    try:
        # At once, before TensorFlow's slow start: matplotlib, something to draw, and
        # somewhere to write it.
        plot.require_matplotlib()
        plot.events_files(args.logdir)
        preflight.check_output_file(output, "-o")
        tfcompat.graph_mode(verbose=False)  # quiet: TensorFlow reads the events files
        series = plot.plot_run(args.logdir, output, title=args.title)
    except (plot.PlotError, config_lib.ConfigError) as e:
        return options.usage_error(e)
    logging.getLogger("sync_mnist").info(
        "wrote %s: contributions %s at global_step %d", output, series.final_contributions,
        series.final_step)
    return config_lib.EXIT_OK
