"""The question's program through sync_mnist's library: synchronous, proved, and it ends.

examples/question_original.py with 6 lines of code changed (docs/fix-your-own-program.md shows
the diff; tests/cluster/test_example.py counts it and runs this file as four processes). Start
one process per task, in any order:

    python examples/question_library.py --job ps --task 0
    python examples/question_library.py --job worker --task 0    # and --task 1, --task 2

A worker killed mid-run is restarted with its same command: it rejoins the running cluster
(docs/fix-your-own-program.md; tests/recovery/test_library_form.py kills one, then the chief).
"""

import argparse
import gzip
import os

import numpy as np
import tensorflow.compat.v1 as tf
import sync_mnist.library as sml

tf.disable_v2_behavior()

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--job", choices=["ps", "worker"], required=True)
parser.add_argument("--task", type=int, required=True)
parser.add_argument("--ps-hosts", default="localhost:2222")
parser.add_argument("--worker-hosts", default="localhost:2223,localhost:2224,localhost:2225")
parser.add_argument("--data-dir", default=os.path.join(os.path.dirname(__file__), os.pardir,
                                                       "sync_mnist", "mnist"),
                    help="the four MNIST IDX .gz files (default: the copy in sync_mnist/mnist)")
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

batch_size = 100
learning_rate = 0.001


def read_mnist(kind):
    """Images float32 [n, 784] in [0, 1] and one-hot labels [n, 10] from the IDX files."""
    with gzip.open(os.path.join(args.data_dir, "%s-images-idx3-ubyte.gz" % kind)) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(args.data_dir, "%s-labels-idx1-ubyte.gz" % kind)) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images.astype(np.float32) / 255, np.eye(10, dtype=np.float32)[labels]


ps_hosts = args.ps_hosts.split(",")
worker_hosts = args.worker_hosts.split(",")
cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
server = tf.train.Server(cluster, job_name=args.job, task_index=args.task)

if args.job == "ps":
    sml.serve(server, cluster)
else:
    is_chief = args.task == 0
    train_x, train_y = read_mnist("train")
    test_x, test_y = read_mnist("t10k")

    with tf.device(tf.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % args.task, cluster=cluster)):
        global_step = tf.Variable(0, name="global_step", trainable=False)
        x = tf.placeholder(tf.float32, [None, 784])
        y_ = tf.placeholder(tf.float32, [None, 10])
        W1 = tf.Variable(tf.random_normal([784, 256]))
        b1 = tf.Variable(tf.random_normal([256]))
        W2 = tf.Variable(tf.random_normal([256, 256]))
        b2 = tf.Variable(tf.random_normal([256]))
        W3 = tf.Variable(tf.random_normal([256, 10]))
        b3 = tf.Variable(tf.random_normal([10]))
        h1 = tf.nn.relu(tf.matmul(x, W1) + b1)
        h2 = tf.nn.relu(tf.matmul(h1, W2) + b2)
        y = tf.matmul(h2, W3) + b3
        cross_entropy = tf.reduce_mean(
            tf.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=y))

        opt = tf.train.AdamOptimizer(learning_rate)
        opt = sml.SyncOptimizer(opt, cluster, args.task)
        train_op = opt.minimize(cross_entropy, global_step=global_step)
        correct = tf.equal(tf.argmax(y, 1), tf.argmax(y_, 1))
        accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))

        init_token_op = opt.get_init_tokens_op()
        chief_queue_runner = opt.get_chief_queue_runner()
        init_op = tf.global_variables_initializer()

    sv = tf.train.Supervisor(is_chief=is_chief, init_op=init_op, global_step=global_step,
                             local_init_op=(opt.chief_init_op if is_chief
                                            else opt.local_step_init_op),
                             ready_for_local_init_op=opt.ready_for_local_init_op)
    sess = opt.prepare_or_wait_for_session(sv, server.target)
    if is_chief:
        sv.start_queue_runners(sess, [chief_queue_runner])
        sess.run(init_token_op)

    rng = np.random.RandomState(args.task)
    batches = len(train_x) // batch_size
    for epoch in range(args.epochs):
        order = rng.permutation(len(train_x))
        for i in range(batches):
            batch = order[i * batch_size:(i + 1) * batch_size]
            _, cost, step = sess.run([train_op, cross_entropy, global_step],
                                     {x: train_x[batch], y_: train_y[batch]})
        print("worker %d: epoch %d done, global_step %d, cost %.4f"
              % (args.task, epoch + 1, step, cost))
    print("worker %d: test accuracy %.4f"
          % (args.task, sess.run(accuracy, {x: test_x, y_: test_y})))
    print("worker %d: %s" % (args.task, opt.finish(sess)))
    sv.stop()
