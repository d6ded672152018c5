"""Sparse (row-wise) optimizers vs dense numpy references, for any ids, duplicates included.

Each reference below is the dense optimizer of the cited paper applied, in float64, to the
dense gradient of the table restricted to the rows the batch touched: a row's gradient is the
sum of every entry with its id (so duplicate ids in a batch must merge exactly), padding ids
(``>= V``) touch nothing, and untouched rows keep their values and their optimizer state
(lazy Adam: no decay of untouched moments; bias correction with the global step t).
"""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from recjax.embeddings import SparseOptimConfig, make_sparse_optimizer

V, D, N = 6, 3, 10  # rows, dim, entries per step (fixed shapes: no recompiles per example)
PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=40)


def _row_sums(ids: np.ndarray, grads: np.ndarray) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for i, g in zip(ids.tolist(), grads):
        if 0 <= i < V:
            out[i] = out.get(i, 0.0) + g.astype(np.float64)
    return out


def reference(cfg: SparseOptimConfig, table: np.ndarray, steps) -> tuple[np.ndarray, tuple]:
    """(table, slots) after `steps` = [(ids, grads)], written from the papers' updates."""
    w = table.astype(np.float64).copy()
    a = np.full((V, D), cfg.initial_accumulator)  # adagrad: per coordinate
    a_row = np.full(V, cfg.initial_accumulator)  # rowwise_adagrad: one per row
    m, v = np.zeros((V, D)), np.zeros((V, D))  # adam moments
    z, n = np.zeros((V, D)), np.zeros((V, D))  # ftrl
    for t0, (ids, grads) in enumerate(steps):
        t = t0 + 1
        for r, g in _row_sums(ids, grads).items():
            if cfg.name == "sgd":  # w <- w - lr g
                w[r] -= cfg.lr * g
            elif cfg.name == "adagrad":  # Duchi et al. 2011: a += g^2; w -= lr g / (sqrt(a) + eps)
                a[r] += g * g
                w[r] -= cfg.lr * g / (np.sqrt(a[r]) + cfg.eps)
            elif cfg.name == "rowwise_adagrad":  # DLRM/FBGEMM: a_r += mean_d g_d^2
                a_row[r] += np.mean(g * g)
                w[r] -= cfg.lr * g / (np.sqrt(a_row[r]) + cfg.eps)
            elif cfg.name == "adam":  # Kingma & Ba 2015, Alg. 1, on the touched rows
                m[r] = cfg.b1 * m[r] + (1 - cfg.b1) * g
                v[r] = cfg.b2 * v[r] + (1 - cfg.b2) * g * g
                m_hat, v_hat = m[r] / (1 - cfg.b1**t), v[r] / (1 - cfg.b2**t)
                w[r] -= cfg.lr * m_hat / (np.sqrt(v_hat) + cfg.eps)
            elif cfg.name == "ftrl":  # McMahan et al. 2013, Alg. 1 (alpha = lr)
                sigma = (np.sqrt(n[r] + g * g) - np.sqrt(n[r])) / cfg.lr
                z[r] += g - sigma * w[r]
                n[r] += g * g
                # |z| at the l1 threshold: float32 and float64 may fall on different sides
                assume(np.all(np.abs(np.abs(z[r]) - cfg.l1) > 1e-4 * (1 + cfg.l1)))
                w[r] = np.where(np.abs(z[r]) <= cfg.l1, 0.0,
                                -(z[r] - np.sign(z[r]) * cfg.l1)
                                / ((cfg.beta + np.sqrt(n[r])) / cfg.lr + cfg.l2))
    slots = {"sgd": (), "adagrad": (a,), "rowwise_adagrad": (a_row,), "adam": (m, v),
             "ftrl": (z, n)}[cfg.name]
    return w, slots


def _run(cfg: SparseOptimConfig, table: np.ndarray, steps):
    opt = make_sparse_optimizer(cfg)
    w, slots = jnp.asarray(table), opt.init(jnp.asarray(table))
    for step, (ids, grads) in enumerate(steps):
        w, slots = opt.update(w, slots, jnp.asarray(ids, jnp.int32), jnp.asarray(grads),
                              jnp.asarray(step, jnp.int32))
    return np.asarray(w), tuple(np.asarray(s) for s in (slots if isinstance(slots, tuple) else (slots,)))


def _check(cfg, table, steps, rtol=1e-5, atol=1e-6):
    want_w, want_slots = reference(cfg, table, steps)
    got_w, got_slots = _run(cfg, table, steps)
    np.testing.assert_allclose(got_w, want_w, rtol=rtol, atol=atol, err_msg=f"{cfg.name} table")
    assert len(got_slots) == len(want_slots)
    for g, s in zip(got_slots, want_slots):
        np.testing.assert_allclose(g, s, rtol=rtol, atol=atol, err_msg=f"{cfg.name} slots")


# Ids from a narrow range (many duplicates), V itself (padding) and one beyond it.
ids_st = st.lists(st.integers(0, V + 2), min_size=N, max_size=N).map(
    lambda x: np.minimum(np.array(x), np.array([V, V + 2] * (N // 2))))
grads_st = st.lists(st.floats(-2, 2, width=32), min_size=N * D, max_size=N * D).map(
    lambda x: np.array(x, np.float32).reshape(N, D))
steps_st = st.lists(st.tuples(ids_st, grads_st), min_size=1, max_size=4)
table_st = st.lists(st.floats(-1, 1, width=32), min_size=V * D, max_size=V * D).map(
    lambda x: np.array(x, np.float32).reshape(V, D))


@PROPS
@given(table=table_st, steps=steps_st, lr=st.sampled_from([0.01, 0.3, 2.0]))
def test_sgd(table, steps, lr):
    _check(SparseOptimConfig(name="sgd", lr=lr), table, steps)


@PROPS
@given(table=table_st, steps=steps_st, lr=st.sampled_from([0.01, 0.3]),
       acc0=st.sampled_from([0.0, 0.1]))
def test_adagrad(table, steps, lr, acc0):
    _check(SparseOptimConfig(name="adagrad", lr=lr, initial_accumulator=acc0), table, steps)


@PROPS
@given(table=table_st, steps=steps_st, lr=st.sampled_from([0.01, 0.3]),
       acc0=st.sampled_from([0.0, 0.1]))
def test_rowwise_adagrad(table, steps, lr, acc0):
    _check(SparseOptimConfig(name="rowwise_adagrad", lr=lr, initial_accumulator=acc0), table, steps)


@PROPS
@given(table=table_st, steps=steps_st, lr=st.sampled_from([0.001, 0.1]),
       b1=st.sampled_from([0.0, 0.9]), b2=st.sampled_from([0.9, 0.999]))
def test_lazy_adam(table, steps, lr, b1, b2):
    # m_hat / sqrt(v_hat) divides two float32 moments: ~1e-5 relative, a composite
    _check(SparseOptimConfig(name="adam", lr=lr, b1=b1, b2=b2), table, steps, rtol=1e-4, atol=1e-6)


@PROPS
@given(table=table_st, steps=steps_st, lr=st.sampled_from([0.05, 0.5]),
       l1=st.sampled_from([0.0, 0.3]), l2=st.sampled_from([0.0, 1.0]),
       beta=st.sampled_from([0.1, 1.0]))
def test_ftrl(table, steps, lr, l1, l2, beta):
    _check(SparseOptimConfig(name="ftrl", lr=lr, l1=l1, l2=l2, beta=beta), table, steps,
           rtol=1e-4, atol=1e-6)


def test_duplicates_merge_before_a_nonlinear_update():
    """One row hit by three entries of the batch: Adagrad applies the summed gradient once.

    Hand-computed, lr = 1, eps = 0, a0 = 1, g = 1 + 2 + 5 = 8: a = 1 + 64 = 65,
    w = 0.5 - 8 / sqrt(65) = -0.4922779. Keeping only the last entry (a scatter-set without the
    merge) gives a = 26, w = -0.4805807; three sequential updates give -1.9216.
    """
    cfg = SparseOptimConfig(name="adagrad", lr=1.0, eps=0.0, initial_accumulator=1.0)
    table = np.full((V, D), 0.5, np.float32)
    ids = np.array([2, V, 2, V, 2, V, V, V, V, V])
    grads = np.zeros((N, D), np.float32)
    grads[[0, 2, 4]] = [[1.0], [2.0], [5.0]]
    got, (acc,) = _run(cfg, table, [(ids, grads)])
    np.testing.assert_allclose(got[2], -0.4922779, rtol=1e-6)
    np.testing.assert_allclose(acc[2], 65.0, rtol=1e-6)
    np.testing.assert_array_equal(np.delete(got, 2, 0), 0.5)  # untouched rows, padding too
    np.testing.assert_array_equal(np.delete(acc, 2, 0), 1.0)


def test_adam_without_momentum_and_refused_betas():
    """b1 = 0 is Adam without momentum (found by test_lazy_adam: ``math.log(0)`` raised
    "math domain error" from inside the update); betas outside [0, 1) are refused by name."""
    table = np.zeros((V, D), np.float32)
    ids = np.array([1] + [V] * (N - 1))
    grads = np.zeros((N, D), np.float32)
    grads[0] = 0.5
    got, _ = _run(SparseOptimConfig(name="adam", lr=0.1, b1=0.0, eps=0.0), table, [(ids, grads)])
    np.testing.assert_allclose(got[1], -0.1, rtol=1e-6)  # m_hat / sqrt(v_hat) = g / |g|
    for bad in (dict(b1=1.0), dict(b2=-0.1)):
        with pytest.raises(ValueError, match=f"sparse.{next(iter(bad))} must be in"):
            SparseOptimConfig(name="adam", **bad)
