"""A task's life in the cluster, and the graph that every task must build the same way.

The protocol, in the order it happens (where each step lives in brackets):

  1. **Start.** Each task starts its gRPC server on its own port [worker.py, ps.py]. A worker
     loads its shard first, so the order in which tasks start does not matter.
  2. **Publish.** The chief initialises the model and the shared variables on the ps, and with
     them its settings (`membership.published`). Every other task, the ps included, compares
     its own settings with them and exits 2 on a difference [membership.py].
  3. **Ready.** A non-chief worker polls every 0.25 s until the chief has initialised the
     model, where `tf.train.Supervisor` waited 30 s between polls [sessions.py].
  4. **Lockstep.** Each local step, a worker pushes one gradient and waits for a token. With
     `num_tokens=0` a token comes only from the update that its gradient joined; the chief's
     queue runner makes each update from R gradients, adds 1 to global_step and hands every
     worker a token. With R = N, each update holds exactly one gradient per worker [sync.py].
  5. **Stop.** A worker stops when the token it is handed reaches the target step, so every
     worker stops on the same update, after a resume or a rejoin too [sync.train_loop]. With
     --target-accuracy, the chief's evaluation that reaches it makes the next update the last
     one, announced with that update's tokens [early_stop.py].
  6. **Finish barrier.** Each worker marks itself finished; the chief marks lost any worker
     whose server is gone or that has not pushed for --timeout. When no worker is still
     running, no gradient is in flight, and every task reads the same final counters
     [membership.finish_barrier].
  7. **Verify.** Every worker reads the counters on the ps and computes the verdict from them:
     synchronous only if each update averaged one gradient from each worker [verdict_lib.verify].
  8. **Evaluate.** The chief evaluates the final weights on the model's evaluation data [chief.py].
  9. **Done.** Each worker puts its index in every ps's done-queue; a ps exits once it holds
     one entry per worker that was not lost, instead of `server.join()` forever [ps.py].

Every wait in steps 2-9 is bounded by --timeout (plus a start-up allowance where the other side
may not exist yet), and its error names what was awaited and who is missing.

`build_shared` makes the variables and queues that more than one task reads or writes. Every
task, the ps tasks included, builds them first and in the same order. Each has an explicit
device (all on ps 0 but the done-queues, one per ps), so every task's graph finds it by name.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from sync_mnist.core import early_stop, membership, sync
from sync_mnist.core import verdict as verdict_lib
from sync_mnist.core.config import TaskConfig, TaskTimeout

tf1 = tf.compat.v1


class Shared(NamedTuple):
    state: sync.SharedState  # global_step and the counters that prove synchrony
    members: membership.Membership  # published settings, last pushes, the finish barrier
    done_queues: list  # one per ps: "I have finished" entries, one per worker
    stop: early_stop.StopVars  # --target-accuracy: the update the cluster stops on


def build_shared(config: TaskConfig, model: dict | None = None) -> Shared:
    """The shared variables and queues, placed identically in every task's graph.

    Args:
      config: this task's configuration; the chief publishes its settings from it.
      model: the model's params and variables (membership.model_settings), compared alike.
    """
    n = config.cluster.num_workers
    state = sync.build_shared_state(n)  # Sync: on ps 0 (inside), as membership and the stop
    members = membership.build_membership(n, membership.settings(config, model))
    done_queues = [done_queue(p, n) for p in range(config.cluster.num_ps)]
    # Explicitly on ps 0 too, last: built whatever the flags, so every task's graph is the same.
    return Shared(state, members, done_queues, early_stop.build_stop_vars())


def done_queue(ps_index: int, num_workers: int):
    """Worker -> ps 'I have finished' messages. Shared by name between the graphs of all tasks."""
    with tf1.device(f"/job:ps/task:{ps_index}"):
        return tf1.FIFOQueue(num_workers, tf.int32, shapes=[], name=f"done_queue_{ps_index}",
                             shared_name=f"done_queue_{ps_index}")


# A done-queue entry of a worker that exited with bad input (2), not done: -1 - its index.
def bad_input_entry(worker: int) -> int:
    return -1 - worker


def tell_the_ps_of_bad_input(config: TaskConfig, seconds: float = 10.0) -> bool:
    """A worker that exits 2 (bad input: permanent, no restart mends it) puts its entry in every
    ps's done-queue, so that each ps ends with it at once, exit 2, instead of waiting out its
    start-up bound for a worker that will not come (then 200, retried: a TFJob would recreate
    the ps for nothing). Through ps 0's own master, as this worker may have no server yet;
    within `seconds`. Whether the ps took it (a ps not there yet is told nothing)."""
    from sync_mnist.core import bounded

    n, hosts = config.cluster.num_workers, config.cluster.ps_hosts
    graph = tf.Graph()
    with graph.as_default():
        tell = tf.group(*[done_queue(p, n).enqueue(bad_input_entry(config.index))
                          for p in range(len(hosts))])

    def run():
        sess = tf1.Session(f"grpc://{hosts[0]}", graph=graph,
                           config=tf1.ConfigProto(device_filters=["/job:ps"]))
        try:
            sess.run(tell, options=tf1.RunOptions(timeout_in_ms=int(seconds * 1000)))
        finally:
            bounded.close_bounded(sess.close, sess)

    try:
        bounded.bounded_call(run, seconds, f"{config.name}: telling the ps of its bad input")
        return True
    except (TaskTimeout, tf.errors.OpError):
        return False
