"""Embedding lookup and sparse optimizers against dense numpy references.

The references differentiate w.r.t. the *whole* table (fine for tiny tables in a test), so a
wrong duplicate merge, a misplaced field or a padding id touching a real row fails exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax.embeddings import (
    SparseOptimConfig,
    init_tables,
    lookup,
    make_layout,
    make_sparse_optimizer,
    row_gradients,
)
from recjax.features import FeatureSpec, FieldSpec

# Fields a and c share table "ac"; b is multi-hot (L = 3).
SPEC = FeatureSpec(dense_names=(), fields=(
    FieldSpec("a", 7, table="ac"), FieldSpec("b", 5, max_len=3), FieldSpec("c", 7, table="ac")))


def _batch(rng, b=6):
    ids = np.stack([rng.integers(0, 7, (b, 3)), rng.integers(0, 5, (b, 3)),
                    rng.integers(0, 7, (b, 3))], 1).astype(np.int32)
    mask = np.zeros((b, 3, 3), np.float32)
    mask[:, 0, 0] = mask[:, 2, 0] = 1  # one-hot fields: position 0 only
    mask[:, 1, :] = rng.random((b, 3)) < 0.6
    mask[0, 1, :] = 0  # an empty multi-hot list
    ids = np.where(mask > 0, ids, 0)  # padding ids are 0, as readers write them
    return ids, mask


def _ref_lookup(tables, ids, mask, pooling):
    out = np.zeros((ids.shape[0], 3, tables["emb/ac"].shape[1]))
    for i in range(ids.shape[0]):
        for f, t in enumerate(["emb/ac", "emb/b", "emb/ac"]):
            rows = [tables[t][ids[i, f, j]] * mask[i, f, j] for j in range(3)]
            s = np.sum(rows, 0)
            if pooling == "mean":
                s = s / max(mask[i, f].sum(), 1)
            out[i, f] = s
    return out


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_lookup_matches_loop(pooling):
    rng = np.random.default_rng(0)
    layout = make_layout(SPEC, {"emb": 4}, pooling)
    assert [t.name for t in layout.tables] == ["emb/ac", "emb/b"]
    assert layout.tables[0].feature_names == ("a", "c")
    tables = init_tables(layout, seed=1, scale=0.5)
    ids, mask = _batch(rng)
    acts = lookup(layout, tables, jnp.asarray(ids), jnp.asarray(mask))["emb"]
    np.testing.assert_allclose(acts, _ref_lookup(tables, ids, mask, pooling), rtol=1e-6, atol=1e-6)


def _dense_table_grads(layout, tables, ids, mask, w):
    """d/dT of sum(w * acts): the whole-table gradient (test-only; never do this in training)."""
    def f(t):
        return jnp.sum(lookup(layout, t, jnp.asarray(ids), jnp.asarray(mask))["emb"] * w)
    return jax.grad(f)({k: jnp.asarray(v) for k, v in tables.items()})


def _ref_update(name, cfg, table, slots, g, touched, step):
    """Dense numpy optimizer on the rows `touched` (the rows with a real id in the batch)."""
    w, g = table.astype(np.float64).copy(), g.astype(np.float64)
    r = touched
    if name == "sgd":
        w -= cfg.lr * g  # untouched rows have g == 0
        return w, slots
    if name == "adagrad":
        a = slots.astype(np.float64).copy()
        a[r] += g[r] ** 2
        w[r] -= cfg.lr * g[r] / (np.sqrt(a[r]) + cfg.eps)
        return w, a
    if name == "rowwise_adagrad":
        a = slots.astype(np.float64).copy()
        a[r] += (g[r] ** 2).mean(1)
        w[r] -= cfg.lr * g[r] / (np.sqrt(a[r])[:, None] + cfg.eps)
        return w, a
    if name == "adam":
        m, v = (s.astype(np.float64).copy() for s in slots)
        t = step + 1
        m[r] = cfg.b1 * m[r] + (1 - cfg.b1) * g[r]
        v[r] = cfg.b2 * v[r] + (1 - cfg.b2) * g[r] ** 2
        w[r] -= cfg.lr * (m[r] / (1 - cfg.b1**t)) / (np.sqrt(v[r] / (1 - cfg.b2**t)) + cfg.eps)
        return w, (m, v)
    if name == "ftrl":
        z, n = (s.astype(np.float64).copy() for s in slots)
        nn = n[r] + g[r] ** 2
        sigma = (np.sqrt(nn) - np.sqrt(n[r])) / cfg.lr
        z[r] = z[r] + g[r] - sigma * w[r]
        n[r] = nn
        w[r] = np.where(np.abs(z[r]) <= cfg.l1, 0.0,
                        -(z[r] - np.sign(z[r]) * cfg.l1) / ((cfg.beta + np.sqrt(nn)) / cfg.lr + cfg.l2))
        return w, (z, n)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"])
def test_sparse_optimizers_match_dense_reference(name):
    rng = np.random.default_rng(3)
    layout = make_layout(SPEC, {"emb": 4}, "sum")
    tables = init_tables(layout, seed=2, scale=0.5)
    cfg = SparseOptimConfig(name=name, lr=0.1, l1=0.01, l2=0.1, initial_accumulator=0.1)
    opt = make_sparse_optimizer(cfg)
    slots = {k: opt.init(jnp.asarray(v)) for k, v in tables.items()}
    state = {k: jnp.asarray(v) for k, v in tables.items()}
    ref_t = {k: v.astype(np.float64) for k, v in tables.items()}
    ref_s = jax.tree.map(np.asarray, slots)
    for step in range(3):  # several steps: the slots carry over
        ids, mask = _batch(rng)
        # heavy duplicates: the shared table sees ids from two fields, many repeated
        w = rng.normal(size=(ids.shape[0], 3, 4)).astype(np.float32)
        g_dense = _dense_table_grads(layout, {k: np.asarray(v) for k, v in state.items()},
                                     ids, mask, w)
        rows = row_gradients(layout, {"emb": jnp.asarray(w)}, jnp.asarray(ids), jnp.asarray(mask))
        for t in layout.tables:
            fi = list(t.field_index)
            touched = np.unique(ids[:, fi, :][mask[:, fi, :] > 0])
            ref_t[t.name], ref_s[t.name] = _ref_update(
                name, cfg, ref_t[t.name], ref_s[t.name], np.asarray(g_dense[t.name]), touched, step)
            state[t.name], slots[t.name] = opt.update(state[t.name], slots[t.name],
                                                      *rows[t.name], jnp.asarray(step))
    for k in state:
        np.testing.assert_allclose(state[k], ref_t[k], rtol=1e-5, atol=1e-6)
        for got, want in zip(jax.tree.leaves(slots[k]), jax.tree.leaves(ref_s[k])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_padding_never_touches_a_row():
    """Masked positions (id 0 padding) must not move row 0 or its Adam moments."""
    spec = FeatureSpec((), (FieldSpec("s", 4, max_len=3),))
    layout = make_layout(spec, {"emb": 2})
    opt = make_sparse_optimizer(SparseOptimConfig(name="adam", lr=0.1))
    table = jnp.ones((4, 2))
    slots = opt.init(table)
    ids = jnp.asarray([[[2, 0, 0]]], jnp.int32)
    mask = jnp.asarray([[[1.0, 0.0, 0.0]]])
    rows = row_gradients(layout, {"emb": jnp.ones((1, 1, 2))}, ids, mask)["emb/s"]
    new, (m, v) = opt.update(table, slots, *rows, jnp.asarray(0))
    np.testing.assert_array_equal(new[0], table[0])
    np.testing.assert_array_equal(m[0], 0)
    assert not np.allclose(new[2], table[2])


def test_unknown_optimizer_message():
    with pytest.raises(ValueError, match="choose one of"):
        SparseOptimConfig(name="lamb")


def test_per_field_pooling_overrides_the_default():
    spec = FeatureSpec((), (FieldSpec("s", 5, max_len=3, pooling="mean"), FieldSpec("t", 5, max_len=3)))
    layout = make_layout(spec, {"emb": 2}, "sum")
    assert [t.pooling for t in layout.tables] == ["mean", "sum"]
    tables = {"emb/s": np.ones((5, 2), np.float32), "emb/t": np.ones((5, 2), np.float32)}
    ids = jnp.zeros((1, 2, 3), jnp.int32)
    mask = jnp.asarray([[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]])
    acts = lookup(layout, tables, ids, mask)["emb"]
    np.testing.assert_allclose(acts[0], [[1.0, 1.0], [2.0, 2.0]])
    with pytest.raises(ValueError, match="different poolings"):
        make_layout(FeatureSpec((), (FieldSpec("a", 5, table="x", pooling="mean"),
                                     FieldSpec("b", 5, table="x"))), {"emb": 2}, "sum")


def test_tables_with_similar_names_get_different_init():
    spec = FeatureSpec((), (FieldSpec("user_feature_0001", 50), FieldSpec("user_feature_0002", 50)))
    t = init_tables(make_layout(spec, {"emb": 4}), seed=0)
    assert not np.array_equal(t["emb/user_feature_0001"], t["emb/user_feature_0002"])
