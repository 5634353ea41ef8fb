"""Rows of the Adult census data's format, with a planted truth: what census.py trains on here.

No package on the registry ships the Adult data (UCI's adult.data and adult.test) for use
offline, and nothing here may download it. So this writes files of its exact format instead:
adult.data and adult.test as census_dataset.py left them in --data_dir after its download
(UCI's files with ", " made "," and adult.test's trailing "." and first line dropped): 15
columns, adult.data's vocabulary in every categorical column, values in its ranges, and about
its frequencies. Each row's label is drawn from a known logistic model of the columns the
program reads (PLANTED_* below), so the best accuracy and AUC any model can reach on the
evaluation file are known: the planted model's own, written to census.json beside the files.

    python examples/census/write_census.py DIR [--train-rows 32561] [--eval-rows 16281]

writes DIR/adult.data, DIR/adult.test and DIR/census.json. On UCI's real files the program's
README reports an accuracy over 83% after 40 epochs; the numbers here are of these rows only.
Pure numpy: no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
           "occupation", "relationship", "race", "gender", "capital_gain", "capital_loss",
           "hours_per_week", "native_country", "income_bracket"]
TRAIN_ROWS, EVAL_ROWS = 32561, 16281  # adult.data's and adult.test's

# Each categorical column's values, as adult.data spells them, with about its frequencies.
WORKCLASS = {"Private": .697, "Self-emp-not-inc": .078, "Local-gov": .064, "?": .056,
             "State-gov": .040, "Self-emp-inc": .034, "Federal-gov": .029,
             "Without-pay": .0013, "Never-worked": .0007}
EDUCATION = {"HS-grad": .322, "Some-college": .224, "Bachelors": .164, "Masters": .053,
             "Assoc-voc": .042, "11th": .036, "Assoc-acdm": .033, "10th": .029,
             "7th-8th": .020, "Prof-school": .018, "9th": .016, "12th": .013,
             "Doctorate": .013, "5th-6th": .010, "1st-4th": .005, "Preschool": .002}
EDUCATION_NUM = {"Preschool": 1, "1st-4th": 2, "5th-6th": 3, "7th-8th": 4, "9th": 5,
                 "10th": 6, "11th": 7, "12th": 8, "HS-grad": 9, "Some-college": 10,
                 "Assoc-voc": 11, "Assoc-acdm": 12, "Bachelors": 13, "Masters": 14,
                 "Prof-school": 15, "Doctorate": 16}
MARITAL_STATUS = {"Married-civ-spouse": .460, "Never-married": .328, "Divorced": .136,
                  "Separated": .031, "Widowed": .030, "Married-spouse-absent": .013,
                  "Married-AF-spouse": .002}
OCCUPATION = {"Prof-specialty": .135, "Craft-repair": .134, "Exec-managerial": .132,
              "Adm-clerical": .123, "Sales": .119, "Other-service": .107,
              "Machine-op-inspct": .065, "Transport-moving": .052,
              "Handlers-cleaners": .045, "Farming-fishing": .032, "Tech-support": .030,
              "Protective-serv": .021, "Priv-house-serv": .005, "Armed-Forces": .0003}
RELATIONSHIP = ["Husband", "Not-in-family", "Wife", "Own-child", "Unmarried",
                "Other-relative"]
RACE = {"White": .854, "Black": .096, "Asian-Pac-Islander": .032,
        "Amer-Indian-Eskimo": .010, "Other": .008}
GENDER = {"Male": .669, "Female": .331}
OTHER_COUNTRIES = [
    "Cambodia", "England", "Puerto-Rico", "Canada", "Germany", "Outlying-US(Guam-USVI-etc)",
    "India", "Japan", "Greece", "South", "China", "Cuba", "Iran", "Honduras", "Philippines",
    "Italy", "Poland", "Jamaica", "Vietnam", "Portugal", "Ireland", "France",
    "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia", "Hungary",
    "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
    "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"]
NATIVE_COUNTRY = {"United-States": .896, "Mexico": .020, "?": .018,
                  **{c: .066 / len(OTHER_COUNTRIES) for c in OTHER_COUNTRIES}}
CAPITAL_GAINS = [594, 1055, 2174, 2407, 3103, 3325, 3411, 4386, 4650, 5178, 7298, 7688, 8614,
                 10520, 13550, 14084, 15024, 27828, 99999]  # adult.data's commonest non-zero
CAPITAL_LOSSES = [1485, 1590, 1602, 1672, 1740, 1848, 1876, 1887, 1902, 1977, 2415]
LABELS = ("<=50K", ">50K")

# The planted truth: P(>50K) = sigmoid(logit), the logit a sum of these terms over the columns
# census.py reads (education_num, age, marital_status, relationship, occupation, workclass,
# hours_per_week, capital_gain and capital_loss), and one crossing (education x occupation)
# for the wide part's crossed columns. fnlwgt, race, gender and native_country play no part.
PLANTED_BIAS = -2.1
PLANTED_EDUCATION_NUM = 0.32  # per year of schooling above 10
PLANTED_AGE = [(0, -2.5), (25, -1.2), (30, -0.4), (35, 0.0), (45, 0.3), (55, 0.1), (65, -0.6)]
PLANTED_MARRIED = 1.8  # Married-civ-spouse or Married-AF-spouse
PLANTED_WIFE = 0.4
PLANTED_OCCUPATION = {"Exec-managerial": 0.8, "Prof-specialty": 0.6, "Tech-support": 0.4,
                      "Sales": 0.2, "Protective-serv": 0.3, "Craft-repair": -0.1,
                      "Adm-clerical": -0.2, "Transport-moving": -0.2,
                      "Machine-op-inspct": -0.4, "Farming-fishing": -0.9,
                      "Handlers-cleaners": -0.9, "Other-service": -1.3,
                      "Priv-house-serv": -2.0, "Armed-Forces": 0.0, "?": -0.8}
PLANTED_WORKCLASS = {"Self-emp-inc": 0.6, "Federal-gov": 0.4, "Self-emp-not-inc": -0.2,
                     "Without-pay": -2.0, "Never-worked": -2.0}
PLANTED_HOURS = 0.035  # per hour a week above 40
PLANTED_CAPITAL_GAIN = 2.8  # for a gain of 5,000 or more
PLANTED_CAPITAL_LOSS = 1.2  # for a loss of 1,800 or more
PLANTED_CROSSED = {("Prof-school", "Prof-specialty"): 1.5,
                   ("Doctorate", "Prof-specialty"): 0.8,
                   ("Masters", "Exec-managerial"): 0.5}


def _draw(rng: np.random.Generator, frequencies: dict, rows: int) -> np.ndarray:
    names = list(frequencies)
    p = np.array([frequencies[n] for n in names], dtype=np.float64)
    return np.array(names, dtype=object)[rng.choice(len(names), rows, p=p / p.sum())]


def generate(rows: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """`rows` census rows: (columns by name, each an array; P(>50K) of each row under the
    planted model; each row's label, 1 for >50K, drawn from it)."""
    rng = np.random.default_rng(seed)
    age = np.minimum(17 + np.round(rng.gamma(2.2, 9.6, rows)), 90).astype(np.int64)
    education = _draw(rng, EDUCATION, rows)
    marital = _draw(rng, MARITAL_STATUS, rows)
    young = age < 25
    marital[young & (rng.random(rows) < 0.8)] = "Never-married"
    gender = _draw(rng, GENDER, rows)
    married = np.isin(marital, ["Married-civ-spouse", "Married-AF-spouse"])
    relationship = np.where(gender == "Male", "Husband", "Wife").astype(object)
    single = rng.choice(["Not-in-family", "Unmarried", "Other-relative", "Own-child"], rows,
                        p=[.50, .22, .06, .22])
    single[young & (rng.random(rows) < 0.7)] = "Own-child"
    relationship[~married] = single[~married]
    workclass = _draw(rng, WORKCLASS, rows)
    occupation = _draw(rng, OCCUPATION, rows)
    occupation[np.isin(workclass, ["?", "Never-worked"])] = "?"  # as in adult.data
    hours = np.where(rng.random(rows) < 0.47, 40,
                     np.clip(np.round(rng.normal(41, 12, rows)), 1, 99)).astype(np.int64)
    gain = np.where(rng.random(rows) < 0.083, rng.choice(CAPITAL_GAINS, rows), 0)
    loss = np.where(rng.random(rows) < 0.047, rng.choice(CAPITAL_LOSSES, rows), 0)
    columns = {
        "age": age, "workclass": workclass,
        "fnlwgt": np.clip(np.round(np.exp(rng.normal(12.0, 0.5, rows))), 12285,
                          1484705).astype(np.int64),
        "education": education,
        "education_num": np.array([EDUCATION_NUM[e] for e in education], dtype=np.int64),
        "marital_status": marital, "occupation": occupation, "relationship": relationship,
        "race": _draw(rng, RACE, rows), "gender": gender,
        "capital_gain": gain.astype(np.int64), "capital_loss": loss.astype(np.int64),
        "hours_per_week": hours, "native_country": _draw(rng, NATIVE_COUNTRY, rows)}
    probability = 1 / (1 + np.exp(-planted_logit(columns)))
    labels = (rng.random(rows) < probability).astype(np.int64)
    return columns, probability, labels


def planted_logit(columns: dict) -> np.ndarray:
    """The planted model's logit of each row: P(>50K) = sigmoid(logit)."""
    logit = PLANTED_BIAS + PLANTED_EDUCATION_NUM * (columns["education_num"] - 10)
    starts, terms = zip(*PLANTED_AGE)  # each age takes the term of the last band it reaches
    logit = logit + np.array(terms)[np.searchsorted(starts, columns["age"], side="right") - 1]
    logit = logit + PLANTED_MARRIED * np.isin(columns["marital_status"],
                                              ["Married-civ-spouse", "Married-AF-spouse"])
    logit = logit + PLANTED_WIFE * (columns["relationship"] == "Wife")
    logit = logit + np.array([PLANTED_OCCUPATION[o] for o in columns["occupation"]])
    logit = logit + np.array([PLANTED_WORKCLASS.get(w, 0.0) for w in columns["workclass"]])
    logit = logit + PLANTED_HOURS * (columns["hours_per_week"] - 40)
    logit = logit + PLANTED_CAPITAL_GAIN * (columns["capital_gain"] >= 5000)
    logit = logit + PLANTED_CAPITAL_LOSS * (columns["capital_loss"] >= 1800)
    logit = logit + np.array([PLANTED_CROSSED.get(pair, 0.0) for pair in
                              zip(columns["education"], columns["occupation"])])
    return logit


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve: the chance that a positive row outscores a negative one
    (ties count half), from the scores' ranks."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores[np.diff(np.sort(scores), prepend=np.nan) == 0]):
        ranks[scores == value] = ranks[scores == value].mean()  # ties share their mean rank
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def planted_truth(probability: np.ndarray, labels: np.ndarray) -> dict:
    """What the planted model scores on rows it labelled: the best a model can expect."""
    p = np.clip(probability, 1e-7, 1 - 1e-7)
    return {"rows": int(len(labels)), "label_mean": float(labels.mean()),
            "planted_accuracy": float(np.mean((p > 0.5) == labels)),
            "planted_auc": auc(labels, p),
            "planted_average_loss": float(np.mean(-labels * np.log(p) -
                                                  (1 - labels) * np.log(1 - p))),
            "accuracy_baseline": float(max(labels.mean(), 1 - labels.mean()))}


def write_rows(path: Path, columns: dict, labels: np.ndarray) -> None:
    """The rows as census_dataset.py's cleaned files have them: comma-separated, no spaces."""
    values = [columns[name] for name in COLUMNS[:-1]] + [np.array(LABELS, object)[labels]]
    path.write_text("".join(",".join(str(v) for v in row) + "\n" for row in zip(*values)))


def write(directory: Path, train_rows: int = TRAIN_ROWS, eval_rows: int = EVAL_ROWS,
          seed: int = 0) -> dict:
    """Writes adult.data, adult.test and census.json into `directory`; returns the latter."""
    directory.mkdir(parents=True, exist_ok=True)
    truth = {"seed": seed}
    for name, rows, part in (("adult.data", train_rows, 0), ("adult.test", eval_rows, 1)):
        columns, probability, labels = generate(rows, seed * 2 + part)
        write_rows(directory / name, columns, labels)
        truth["train" if part == 0 else "eval"] = planted_truth(probability, labels)
    (directory / "census.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="where to write the files")
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS,
                        help=f"rows of adult.data (default: {TRAIN_ROWS}, the real file's)")
    parser.add_argument("--eval-rows", type=int, default=EVAL_ROWS,
                        help=f"rows of adult.test (default: {EVAL_ROWS}, the real file's)")
    parser.add_argument("--seed", type=int, default=0, help="the rows' seed (default: 0)")
    args = parser.parse_args(argv)
    truth = write(args.directory, args.train_rows, args.eval_rows, args.seed)["eval"]
    print(f"wrote {args.directory}/adult.data ({args.train_rows} rows) and adult.test "
          f"({args.eval_rows} rows); on adult.test the planted model scores "
          f"accuracy={truth['planted_accuracy']:.4f} auc={truth['planted_auc']:.4f} "
          f"average_loss={truth['planted_average_loss']:.4f} (label mean "
          f"{truth['label_mean']:.4f}, accuracy_baseline {truth['accuracy_baseline']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
