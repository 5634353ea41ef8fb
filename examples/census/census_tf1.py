"""TensorFlow's wide & deep census program as TF 1.15 users ran it, in one file: the feature
columns and the input function of tensorflow/models official/r1/wide_deep/census_dataset.py,
the Estimator and the train-and-evaluate loop of census_main.py and wide_deep_run_loop.py
(without the download, the benchmark logger and the --model_type choice: wide & deep only).

It does not run on TensorFlow 2.16 or later (no tf.estimator); census.py beside it is the
same program for sync_mnist (docs/your-model.md, "From a canned Estimator", shows the diff and
tests/fast/test_census.py counts it). Run it, under TF 1.15, as
  python census_tf1.py --data_dir /tmp/census_data --model_dir /tmp/census_model
"""

import os

from absl import app
from absl import flags
import tensorflow as tf

TRAINING_FILE = "adult.data"
EVAL_FILE = "adult.test"

_CSV_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education_num",
    "marital_status", "occupation", "relationship", "race", "gender",
    "capital_gain", "capital_loss", "hours_per_week", "native_country",
    "income_bracket"
]

_CSV_COLUMN_DEFAULTS = [[0], [""], [0], [""], [0], [""], [""], [""], [""], [""],
                        [0], [0], [0], [""], [""]]

_HASH_BUCKET_SIZE = 1000

_NUM_EXAMPLES = {"train": 32561, "validation": 16281}


def build_model_columns():
    """The wide columns and the deep columns."""
    # The numbers, as they are.
    age = tf.feature_column.numeric_column("age")
    education_num = tf.feature_column.numeric_column("education_num")
    capital_gain = tf.feature_column.numeric_column("capital_gain")
    capital_loss = tf.feature_column.numeric_column("capital_loss")
    hours_per_week = tf.feature_column.numeric_column("hours_per_week")

    education = tf.feature_column.categorical_column_with_vocabulary_list(
        "education", [
            "Bachelors", "HS-grad", "11th", "Masters", "9th", "Some-college",
            "Assoc-acdm", "Assoc-voc", "7th-8th", "Doctorate", "Prof-school",
            "5th-6th", "10th", "1st-4th", "Preschool", "12th"])

    marital_status = tf.feature_column.categorical_column_with_vocabulary_list(
        "marital_status", [
            "Married-civ-spouse", "Divorced", "Married-spouse-absent",
            "Never-married", "Separated", "Married-AF-spouse", "Widowed"])

    relationship = tf.feature_column.categorical_column_with_vocabulary_list(
        "relationship", [
            "Husband", "Not-in-family", "Wife", "Own-child", "Unmarried",
            "Other-relative"])

    workclass = tf.feature_column.categorical_column_with_vocabulary_list(
        "workclass", [
            "Self-emp-not-inc", "Private", "State-gov", "Federal-gov",
            "Local-gov", "?", "Self-emp-inc", "Without-pay", "Never-worked"])

    # Occupation is hashed, for the example's sake.
    occupation = tf.feature_column.categorical_column_with_hash_bucket(
        "occupation", hash_bucket_size=_HASH_BUCKET_SIZE)

    age_buckets = tf.feature_column.bucketized_column(
        age, boundaries=[18, 25, 30, 35, 40, 45, 50, 55, 60, 65])

    base_columns = [
        education, marital_status, relationship, workclass, occupation,
        age_buckets,
    ]

    crossed_columns = [
        tf.feature_column.crossed_column(
            ["education", "occupation"], hash_bucket_size=_HASH_BUCKET_SIZE),
        tf.feature_column.crossed_column(
            [age_buckets, "education", "occupation"],
            hash_bucket_size=_HASH_BUCKET_SIZE),
    ]

    wide_columns = base_columns + crossed_columns

    deep_columns = [
        age,
        education_num,
        capital_gain,
        capital_loss,
        hours_per_week,
        tf.feature_column.indicator_column(workclass),
        tf.feature_column.indicator_column(education),
        tf.feature_column.indicator_column(marital_status),
        tf.feature_column.indicator_column(relationship),
        # Occupation's hashed ids, embedded.
        tf.feature_column.embedding_column(occupation, dimension=8),
    ]

    return wide_columns, deep_columns


def input_fn(data_file, num_epochs, shuffle, batch_size):
    """The input function of the Estimator: the CSV file's lines, parsed."""
    assert tf.gfile.Exists(data_file), (
        "%s not found: set --data_dir to the directory that holds it." % data_file)

    def parse_csv(value):
        tf.logging.info("Parsing {}".format(data_file))
        columns = tf.decode_csv(value, record_defaults=_CSV_COLUMN_DEFAULTS)
        features = dict(list(zip(_CSV_COLUMNS, columns)))
        labels = features.pop("income_bracket")
        classes = tf.equal(labels, ">50K")  # binary classification
        return features, classes

    dataset = tf.data.TextLineDataset(data_file)

    if shuffle:
        dataset = dataset.shuffle(buffer_size=_NUM_EXAMPLES["train"])

    dataset = dataset.map(parse_csv, num_parallel_calls=5)

    # Repeat after the shuffle, so that one epoch ends before the next begins.
    dataset = dataset.repeat(num_epochs)
    dataset = dataset.batch(batch_size)
    return dataset


def build_estimator(model_dir, model_column_fn, inter_op, intra_op):
    """The wide & deep Estimator, on the CPU."""
    wide_columns, deep_columns = model_column_fn()
    hidden_units = [100, 75, 50, 25]

    run_config = tf.estimator.RunConfig().replace(
        session_config=tf.ConfigProto(device_count={"GPU": 0},
                                      inter_op_parallelism_threads=inter_op,
                                      intra_op_parallelism_threads=intra_op))

    return tf.estimator.DNNLinearCombinedClassifier(
        model_dir=model_dir,
        linear_feature_columns=wide_columns,
        dnn_feature_columns=deep_columns,
        dnn_hidden_units=hidden_units,
        config=run_config)


def run_census(flags_obj):
    """Trains and evaluates every `epochs_between_evals` epochs, `train_epochs` in all."""
    train_file = os.path.join(flags_obj.data_dir, TRAINING_FILE)
    test_file = os.path.join(flags_obj.data_dir, EVAL_FILE)

    def train_input_fn():
        return input_fn(train_file, flags_obj.epochs_between_evals, True,
                        flags_obj.batch_size)

    def eval_input_fn():
        return input_fn(test_file, 1, False, flags_obj.batch_size)

    model = build_estimator(flags_obj.model_dir, build_model_columns,
                            flags_obj.inter_op_parallelism_threads,
                            flags_obj.intra_op_parallelism_threads)
    for n in range(flags_obj.train_epochs // flags_obj.epochs_between_evals):
        model.train(input_fn=train_input_fn)
        results = model.evaluate(input_fn=eval_input_fn)
        tf.logging.info("Results at epoch %d / %d",
                        (n + 1) * flags_obj.epochs_between_evals, flags_obj.train_epochs)
        tf.logging.info("-" * 60)
        for key in sorted(results):
            tf.logging.info("%s: %s" % (key, results[key]))


def define_census_flags():
    flags.DEFINE_string("data_dir", "/tmp/census_data", "Where adult.data and adult.test are.")
    flags.DEFINE_string("model_dir", "/tmp/census_model", "The Estimator's model_dir.")
    flags.DEFINE_integer("train_epochs", 40, "Epochs to train.")
    flags.DEFINE_integer("epochs_between_evals", 2, "Epochs between evaluations.")
    flags.DEFINE_integer("batch_size", 40, "Examples a batch.")
    flags.DEFINE_integer("inter_op_parallelism_threads", 0, "0: TensorFlow's choice.")
    flags.DEFINE_integer("intra_op_parallelism_threads", 0, "0: TensorFlow's choice.")


def main(_):
    run_census(flags.FLAGS)


if __name__ == "__main__":
    tf.logging.set_verbosity(tf.logging.INFO)
    define_census_flags()
    app.run(main)
