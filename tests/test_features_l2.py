"""Embedding L2 on the rows a step touches (sparse.embedding_l2, `with_l2`): the gradient each
sparse optimizer receives vs autodiff of the dense penalised loss on a tiny table, and the
updates vs the optimizers' formulas written out in numpy."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax.config import Config, ConfigError, apply_overrides
from recjax.embeddings.sparse_optim import (
    SparseOptimConfig,
    make_sparse_optimizer,
    sgd,
    with_l2,
)
from recjax.train.setup import build
from recjax.train.step import jit_train_step
from tests.test_features_defaults import SPEC, _batch

V, D, LAM, LR = 6, 3, 0.3, 0.1
IDS = np.array([1, 4, 1, 1, V, 0, 4], np.int32)  # duplicates, and one padding entry (id V)


def _setup():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(V, D)).astype(np.float32)
    grads = rng.normal(size=(len(IDS), D)).astype(np.float32)
    return table, grads


def dense_gradient(table, grads):
    """d/dW of sum_e <g_e, W[id_e]> + LAM/2 * sum_{r touched} ||W_r||^2, by autodiff."""
    touched = np.zeros(V, bool)
    touched[IDS[IDS < V]] = True

    def loss(w):
        data = sum(jnp.vdot(grads[e], w[i]) for e, i in enumerate(IDS) if i < V)
        return data + LAM / 2 * jnp.sum(jnp.where(touched[:, None], w * w, 0.0))

    return np.asarray(jax.grad(loss)(jnp.asarray(table))), touched


def test_l2_gradient_is_the_dense_penalty_gradient_on_touched_rows():
    table, grads = _setup()
    g, touched = dense_gradient(table, grads)
    # analytic: the summed data gradient plus LAM * w on touched rows, 0 elsewhere
    want = np.zeros_like(table)
    for e, i in enumerate(IDS):
        if i < V:
            want[i] += grads[e]
    want[touched] += LAM * table[touched]
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)
    new, _ = with_l2(sgd(SparseOptimConfig(lr=LR)), LAM).update(jnp.asarray(table), (), IDS,
                                                                jnp.asarray(grads), 0)
    np.testing.assert_allclose(np.asarray(new), table - LR * g, rtol=1e-6, atol=1e-6)
    assert np.array_equal(np.asarray(new)[~touched], table[~touched])  # untouched rows: no decay


@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad", "adam"])
def test_l2_through_the_nonlinear_optimizers(name):
    """The optimizer sees exactly the penalised gradient G (merged per row): its update equals
    its formula applied to G on the touched rows."""
    table, grads = _setup()
    g, touched = dense_gradient(table, grads)
    cfg = SparseOptimConfig(name=name, lr=LR, embedding_l2=LAM)
    opt = make_sparse_optimizer(cfg)
    slots = opt.init(jnp.asarray(table))
    new, _ = opt.update(jnp.asarray(table), slots, IDS, jnp.asarray(grads), jnp.int32(0))
    new = np.asarray(new)
    t, gt = table[touched], g[touched]
    if name == "adagrad":
        want = t - LR * gt / (np.sqrt(gt * gt) + cfg.eps)
    elif name == "rowwise_adagrad":
        a = np.mean(gt * gt, 1, keepdims=True)
        want = t - LR * gt / (np.sqrt(a) + cfg.eps)
    else:  # Adam, step 1: m_hat = g, v_hat = g^2
        want = t - LR * gt / (np.sqrt(gt * gt) + cfg.eps)
    np.testing.assert_allclose(new[touched], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(new[~touched], table[~touched])


def test_l2_zero_is_the_optimizer_itself():
    opt = sgd(SparseOptimConfig())
    assert with_l2(opt, 0.0) is opt
    with pytest.raises(ConfigError, match="embedding_l2 must be >= 0"):
        apply_overrides(Config(), [("sparse.embedding_l2", "-1e-3")])


def test_train_step_applies_l2_to_touched_rows_only():
    """Same batch, SGD tables, with and without L2: the difference of the updated tables is
    -lr * lam * w on the batch's rows and 0 on every other row."""
    cfg = Config()
    cfg = dataclasses.replace(cfg, sparse=SparseOptimConfig(name="sgd", lr=LR),
                              model=dataclasses.replace(cfg.model, name="deepfm", embed_dim=4,
                                                        deep_mlp=(8,)))
    batch = _batch(8)
    out = {}
    for lam in (0.0, LAM):
        c = dataclasses.replace(cfg, sparse=dataclasses.replace(cfg.sparse, embedding_l2=lam))
        model, tx, sopt, state = build(c, SPEC)
        t0 = jax.tree.map(np.asarray, state.tables)
        new, _ = jit_train_step(model, tx, sopt)(state, batch)
        out[lam] = jax.tree.map(np.asarray, new.tables)
    used = {"ac": np.unique(batch.ids[:, [0, 2], 0]), "b": np.unique(batch.ids[:, 1, 0])}
    for name, t in t0.items():
        diff = out[LAM][name] - out[0.0][name]
        rows = used[name.split("/")[1]]
        want = np.zeros_like(t)
        want[rows] = -LR * LAM * t[rows]
        np.testing.assert_allclose(diff, want, rtol=1e-4, atol=1e-7, err_msg=name)
