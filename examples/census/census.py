"""census_tf1.py, TensorFlow's wide & deep census program, migrated to sync_mnist: the same
feature columns, input function and canned model (docs/your-model.md, "From a canned
Estimator", shows the diff; tests/fast/test_census.py counts it).

Write the census files (generated rows of adult.data's format with a planted truth:
write_census.py says why), then train on them:
  python examples/census/write_census.py /tmp/census_data
  sync-mnist-cluster --model examples/census/census.py:MODEL --logdir /tmp/census_model \
      --workers 2 --batch-size 40 --epochs 40
The data directory is its param data_dir (default /tmp/census_data), as --data-dir gives it
(or --param data_dir=...).
"""

import os

import tensorflow.compat.v1 as tf

import sync_mnist.canned as canned

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


def input_fn(data_file, shuffle):
    """The input function of the Estimator: the CSV file's lines, parsed."""
    assert tf.gfile.Exists(data_file), (
        "%s not found: set --data-dir to the directory that holds it." % data_file)

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
    return dataset


def train_input_fn(params):
    return input_fn(os.path.join(params["data_dir"], TRAINING_FILE), True)


def eval_input_fn(params):
    return input_fn(os.path.join(params["data_dir"], EVAL_FILE), False)


def build_estimator(model_column_fn):
    """The wide & deep model."""
    wide_columns, deep_columns = model_column_fn()
    hidden_units = [100, 75, 50, 25]

    return canned.DNNLinearCombinedClassifier(
        linear_feature_columns=wide_columns,
        dnn_feature_columns=deep_columns,
        dnn_hidden_units=hidden_units,
        train_input_fn=train_input_fn,
        eval_input_fn=eval_input_fn,
        params={"data_dir": "/tmp/census_data"})


MODEL = build_estimator(build_model_columns)
