"""Train NE of a real (tiny) trainer run vs NE written out from its definition in numpy.

NE (He et al. 2014, Sec. 2; ShadowSync, Zheng et al. 2020, Eq. 2) is the mean log loss over the
N scored examples divided by the entropy of their mean label:

    NE = (1/N) sum_i [-y_i log p_i - (1 - y_i) log(1 - p_i)]  /  H(p_bar),
    p_bar = (1/N) sum_i y_i,   H(p) = -p log p - (1 - p) log(1 - p).

Nothing here calls recjax's metric code: the reference is numpy over the labels of the
training stream and logits of a numpy FM forward pass.
"""

import dataclasses

import numpy as np
import pytest

from recjax import configs
from recjax.config import DenseOptimConfig
from recjax.data.synthetic import SyntheticSource
from recjax.embeddings import SparseOptimConfig
from recjax.models.config import ModelConfig
from recjax.train.loop import run

# A learning rate this small leaves every float32 parameter where it started (w - 1e-30 g == w
# for |w| > ~1e-23; a zero-initialised one moves to ~1e-30): the model that scored each training
# batch is the final model, so the training examples' logits can be recomputed after the run.
FROZEN = 1e-30


def _ne_reference(labels: np.ndarray, logits: np.ndarray) -> float:
    y, z = labels.astype(np.float64), logits.astype(np.float64)
    p = 1.0 / (1.0 + np.exp(-z))
    mean_logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    ctr = y.mean()
    return mean_logloss / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))


def _fm_logits(state, spec, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rendle's FM in numpy: w0 + sum_f w_f + dense . w_d + sum_{i<j} <v_i, v_j>."""
    params = {k: np.asarray(v, np.float64) for k, v in state.params.items()}
    tables = {k: np.asarray(v, np.float64) for k, v in state.tables.items()}
    wide = np.stack([tables[f"wide/{f.table}"][ids[:, i, 0], 0] for i, f in enumerate(spec.fields)], 1)
    v = np.stack([tables[f"emb/{f.table}"][ids[:, i, 0]] for i, f in enumerate(spec.fields)], 1)
    pairs = sum(np.sum(v[:, i] * v[:, j], axis=1)
                for i in range(v.shape[1]) for j in range(i + 1, v.shape[1]))
    return params["bias"] + wide.sum(1) + dense.astype(np.float64) @ params["dense_w"] + pairs


@pytest.mark.parametrize("teacher_bias", [-1.0, -3.0])
def test_train_ne_matches_definition(tmp_path, teacher_bias):
    """summary['train_ne'] of a one-epoch FM run equals NE computed in numpy from its definition.

    Bug reproduction (issue 14): Train NE divided by the click count instead of the example count,

        contract.ne_from_sums:  s["logloss_sum"] / max(s["label_sum"], 1.0) / h      # was: s["count"]

    passed every test; here it is off by the factor 1/CTR. The teacher bias sets the click rate
    (about 0.3 and 0.08), so a bug that happens to cancel at one click rate fails at the other.
    """
    cfg = configs.smoke()
    n = 4096  # 16 batches of 256: one epoch scores every example exactly once
    syn = dataclasses.replace(cfg.synthetic, n_train=n, bias=teacher_bias)
    cfg = dataclasses.replace(
        cfg, synthetic=syn,
        model=ModelConfig(name="fm", embed_dim=4),
        embed=dataclasses.replace(cfg.embed, init="0.5"),
        dense=DenseOptimConfig(name="sgd", lr=FROZEN),
        sparse=SparseOptimConfig(name="sgd", lr=FROZEN),
        train=dataclasses.replace(cfg.train, batch_size=256, epochs=1, steps=0, out=str(tmp_path),
                                  progress=False, eval_every=0))
    out = run(cfg, checkpoints=False)
    assert out["train_examples_scored"] == n

    src = SyntheticSource(syn)
    chunks = list(src.chunks())
    labels = np.concatenate([c.label for c in chunks])
    dense = np.concatenate([c.dense for c in chunks])
    ids = np.concatenate([c.ids for c in chunks])
    assert len(labels) == n and 0.02 < labels.mean() < 0.98
    logits = _fm_logits(out["final_state"], src.spec, dense, ids)
    assert np.std(logits) > 0.3  # the predictions really vary per example
    want = _ne_reference(labels, logits)
    assert out["train_ne"] == pytest.approx(want, rel=1e-4)
