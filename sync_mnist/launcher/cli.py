"""`sync-mnist-cluster`: P ps + N workers as processes on localhost (launch.py runs them)."""

from __future__ import annotations

import sys

from sync_mnist.core import cluster as cluster_lib
from sync_mnist.core import config as config_lib
from sync_mnist.task import options
from sync_mnist.launcher import netns


LAUNCHER_ONLY = ("--ps", "--workers", "--base-port", "--summary-json", "--isolate",
                 "--max-restarts")  # the options no task is started with


def main(argv: list[str] | None = None) -> int:
    """Entry point of `sync-mnist-cluster`: P ps + N workers as processes on localhost."""
    args = launcher_parser().parse_args(argv)
    options.setup_logging(args.verbose, "cluster")
    from sync_mnist.launcher import launch

    try:
        train = _checked(args)
    except ValueError as e:
        return options.usage_error(e)
    passthrough = options.task_arguments(argv if argv is not None else sys.argv[1:],
                                         LAUNCHER_ONLY)
    return launch.run_cluster(num_ps=args.ps, num_workers=args.workers,
                              base_port=args.base_port, train=train,
                              task_args=passthrough, summary_json=args.summary_json,
                              verbose=args.verbose, isolate=args.isolate,
                              max_restarts=args.max_restarts)


def launcher_parser() -> options.Parser:
    parser = options.Parser(prog="sync-mnist-cluster", description="Start a synchronous "
                            "parameter-server cluster on this machine and train a model (--model).")
    parser.add_argument("--ps", type=int, default=cluster_lib.DEFAULT_NUM_PS,
                        help="parameter-server tasks; every weight matrix and bias is cut into "
                             "one slice per ps, so each holds and serves an even share of "
                             f"the model's bytes (default: {cluster_lib.DEFAULT_NUM_PS})")
    parser.add_argument("--workers", type=int, default=cluster_lib.DEFAULT_NUM_WORKERS,
                        help=f"worker tasks (default: {cluster_lib.DEFAULT_NUM_WORKERS})")
    parser.add_argument("--base-port", type=int, default=cluster_lib.DEFAULT_BASE_PORT,
                        help="ps tasks listen from this port, workers after them, as "
                             "`sync-mnist` assumes by default; if any is taken, free ports are "
                             "chosen instead; 0: always free ports; in a private namespace "
                             "(--isolate) every port is free, and 0 means the default "
                             f"(default: {cluster_lib.DEFAULT_BASE_PORT})")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="mend up to this many faults, start-up included: restart a task "
                             "that dies (killed, crashed or timed out; not one that rejected "
                             "its input or found training not synchronous); a task that timed "
                             "out naming a peer as missing has that peer restarted first, "
                             "killed first if it still runs, and the tasks that timed out "
                             "waiting for a peer restarted since are restarted at no charge: "
                             "1 survives any one fault (default: 0)")
    parser.add_argument("--isolate", default="auto", choices=netns.MODES,
                        help="run every task in one private network namespace with loopback "
                             "only, so no other host and no process outside it can reach the "
                             "cluster's ports; auto: where Linux allows it (root, or "
                             "unprivileged user namespaces), else say so once and go on; on: "
                             "exit 2 where impossible (default: auto)")
    options.add_training_options(parser)
    return parser


def _checked(args) -> config_lib.TrainConfig:
    """The training configuration, once the launcher's own options are checked too."""
    if args.ps < 1 or args.workers < 1:
        raise config_lib.ConfigError(
            f"--ps {args.ps} --workers {args.workers}: a cluster needs at least one of each")
    if not 0 <= args.base_port <= 65535:
        raise config_lib.ConfigError(f"--base-port {args.base_port} is outside 0-65535")
    # In a private namespace the tasks take consecutive ports from it (0 means the
    # default there): each task would exit 2 on a port past 65535.
    first = args.base_port or cluster_lib.DEFAULT_BASE_PORT
    last = first + args.ps + args.workers - 1
    if last > 65535:
        raise config_lib.ConfigError(
            f"--base-port {args.base_port}: {args.ps} ps + {args.workers} workers need ports "
            f"{first}-{last}, beyond 65535")
    if args.max_restarts < 0:
        raise config_lib.ConfigError(
            f"--max-restarts must be 0 or more, got {args.max_restarts}")
    train = options.train_config(args)
    train.aggregate(args.workers)
    return train


if __name__ == "__main__":
    sys.exit(main())
