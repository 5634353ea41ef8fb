"""The built-in click model (models/ctr.py's SMALL: 10,000 rows over 2 ps) trained in an
in-process cluster to near its planted optimum, and its SavedModel scoring what it scored."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from inprocess_cluster import run_cluster
from sync_mnist.models import ctr

tf1 = tf.compat.v1


def test_the_ctr_model_nears_its_planted_optimum_synchronously(tmp_path):
    """models/ctr.py's SMALL (10,000 rows over 2 ps, 8 fields of 200 ids, 40,000 clicks): 400
    updates of 2 workers bring the log-loss within 6% of the planted model's own (measured:
    4.2%, 0.5636 against 0.5407; a constant guess is 0.664), the AUC near the planted one.
    The SavedModel takes the raw ids, hashes them itself, and scores the same log-loss."""
    result = run_cluster(2, ctr.SMALL, num_ps=2, train_steps=400, batch_size=100,
                         export_dir=tmp_path / "model")
    assert result.chief.synchronous, result.chief.verdict
    assert result.chief.verdict.startswith("synchronous: each of 400 updates averaged exactly "
                                           "one gradient from each of 2 workers")
    m = result.chief.test_metrics
    assert m["planted_log_loss"] == pytest.approx(0.5407, abs=1e-4)  # the generator's, seed 0
    assert m["log_loss"] < 1.06 * m["planted_log_loss"], m
    assert m["auc"] > 0.95 * m["planted_auc"], m

    clicks = ctr.generate(ctr.SMALL.params, ctr.SMALL.params["eval_examples"], part=1)
    with tf.Graph().as_default(), tf1.Session() as sess:
        meta = tf1.saved_model.loader.load(sess, [tf1.saved_model.SERVING],
                                           str(tmp_path / "model"))
        signature = meta.signature_def["serving_default"]
        assert set(signature.inputs) == {"ids"}
        p = sess.run(signature.outputs["probabilities"].name,
                     {signature.inputs["ids"].name: clicks.ids})
    p = np.clip(p, 1e-7, 1 - 1e-7)
    served = np.mean(-(clicks.labels * np.log(p) + (1 - clicks.labels) * np.log(1 - p)))
    assert served == pytest.approx(m["log_loss"], abs=1e-4)
