"""Embedding PS: mini-table lookups equal full lookups, exact row updates, placement."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.runtime import ps
from recjax.batch import Batch
from recjax.embeddings import (
    SparseOptimConfig,
    lookup,
    make_layout,
    make_sparse_optimizer,
    row_gradients,
)
from recjax.features import FeatureSpec, FieldSpec


def setup(multi_hot=False):
    L = 3 if multi_hot else 1
    spec = FeatureSpec((), (FieldSpec("a", 7, max_len=L, table="ac"), FieldSpec("b", 5),
                            FieldSpec("c", 7, table="ac")))
    layout = make_layout(spec, {"emb": 4, "wide": 1}, pooling="mean")
    rng = np.random.default_rng(0)
    b = 9
    ids = rng.integers(0, 5, (b, 3, L)).astype(np.int32)  # many duplicates
    mask = (rng.random((b, 3, L)) < 0.7).astype(np.float32) if multi_hot else None
    if multi_hot:
        mask[:, :, 0] = 1
    batch = Batch(np.zeros((b, 0), np.float32), ids, mask, np.zeros(b, np.float32))
    tables = {t.name: rng.normal(size=(t.num_embeddings, t.embedding_dim)).astype(np.float32)
              for t in layout.tables}
    return layout, batch, tables


def mini_layout(layout, batch):
    import dataclasses
    return dataclasses.replace(layout, tables=tuple(dataclasses.replace(
        t, num_embeddings=batch.size * len(t.field_index) * batch.ids.shape[2])
        for t in layout.tables))


@pytest.mark.parametrize("multi_hot", [False, True])
def test_mini_table_lookup_and_sgd_push_equal_full_table(multi_hot):
    layout, batch, tables = setup(multi_hot)
    local, rows = ps.localize(layout, batch)
    assert rows["emb/ac"][1] == len(np.unique(batch.ids[:, [0, 2], :]))
    assert rows["emb/ac"] is rows["wide/ac"]  # one remap per shared table
    mini = mini_layout(layout, batch)
    store = ps.EmbeddingPS(layout, tables, {k: () for k in tables},
                           make_sparse_optimizer(SparseOptimConfig("sgd", lr=0.5)),
                           {"emb/ac": 0, "emb/b": 1, "wide/ac": 1, "wide/b": 0}, 2)
    got = lookup(mini, store.pull(rows), local.ids, local.mask)
    want = lookup(layout, tables, batch.ids, batch.mask)
    for g in want:
        np.testing.assert_array_equal(np.asarray(got[g]), np.asarray(want[g]))
    # push a gradient: every duplicate id must accumulate (exactly as on the full table)
    g_acts = {g: np.random.default_rng(1).normal(size=a.shape).astype(np.float32)
              for g, a in want.items()}
    store.push(rows, row_gradients(mini, g_acts, local.ids, local.mask))
    for name, (ids, grads) in row_gradients(layout, g_acts, batch.ids, batch.mask).items():
        ref = tables[name].astype(np.float64).copy()
        ok = np.asarray(ids) < ref.shape[0]
        np.add.at(ref, np.asarray(ids)[ok], -0.5 * np.asarray(grads)[ok])
        np.testing.assert_allclose(store.snapshot()[0][name], ref, rtol=1e-5, atol=1e-6)


def test_adagrad_slots_live_on_the_shard():
    layout, batch, tables = setup()
    opt = make_sparse_optimizer(SparseOptimConfig("adagrad", lr=0.1))
    slots = {k: opt.init(v) for k, v in tables.items()}
    store = ps.EmbeddingPS(layout, tables, slots, opt, {t.name: 0 for t in layout.tables}, 1)
    local, rows = ps.localize(layout, batch)
    mini = mini_layout(layout, batch)
    g_acts = {g: np.ones((batch.size, 3, d), np.float32) for g, d in layout.groups}
    store.push(rows, row_gradients(mini, g_acts, local.ids, local.mask))
    for t in layout.tables:
        ids, g = row_gradients(layout, g_acts, batch.ids, batch.mask)[t.name]
        want_t, want_s = opt.update(jnp.asarray(tables[t.name]), slots[t.name], ids, g, 0)
        np.testing.assert_allclose(store.snapshot()[0][t.name], want_t, rtol=1e-6)
        np.testing.assert_allclose(store.snapshot()[1][t.name], want_s, rtol=1e-6)
    assert store.shards[0].step == 1


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("past_n", ["absent", "garbage"])
def test_pushed_row_sums_update_as_their_entries(name, past_n):
    """`push_sums` (GBA's PS0 pushes its updates this way) of one summed gradient per real row,
    the rows past n absent or garbage, gives the full-table update of the per-entry
    gradients: numpy's `np.add.at` under SGD, the optimizer on the full table under Adagrad."""
    layout, batch, tables = setup(multi_hot=True)
    opt = make_sparse_optimizer(SparseOptimConfig(name, lr=0.3))
    slots = {k: opt.init(v) for k, v in tables.items()}
    store = ps.EmbeddingPS(layout, tables, slots, opt,
                           {"emb/ac": 0, "emb/b": 1, "wide/ac": 1, "wide/b": 0}, 2)
    local, rows = ps.localize(layout, batch)
    mini = mini_layout(layout, batch)
    rng = np.random.default_rng(2)
    g_acts = {g: rng.normal(size=(batch.size, 3, d)).astype(np.float32) for g, d in layout.groups}
    sums = {}
    for k, (lids, g) in row_gradients(mini, g_acts, local.ids, local.mask).items():
        ids, n = rows[k]
        full = np.zeros((ids.size, g.shape[-1]), np.float32)
        lids, g = np.asarray(lids).ravel(), np.asarray(g).reshape(-1, g.shape[-1])
        ok = lids < ids.size
        np.add.at(full, lids[ok], g[ok])
        if past_n == "garbage":
            full[n:] = 1e3
        sums[k] = full if past_n == "garbage" else full[:n]
    store.push_sums(rows, sums)
    got_t, got_s = store.snapshot()
    for k, (ids, g) in row_gradients(layout, g_acts, batch.ids, batch.mask).items():
        if name == "sgd":
            ref = tables[k].astype(np.float64).copy()
            ok = np.asarray(ids) < ref.shape[0]
            np.add.at(ref, np.asarray(ids)[ok], -0.3 * np.asarray(g)[ok])
            np.testing.assert_allclose(got_t[k], ref, rtol=1e-5, atol=1e-6)
        else:
            want_t, want_s = opt.update(jnp.asarray(tables[k]), slots[k], ids, g, 0)
            np.testing.assert_allclose(got_t[k], want_t, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got_s[k], want_s, rtol=1e-5, atol=1e-6)
        assert not np.allclose(got_t[k], tables[k])


def test_placement_mod_and_binpack():
    costs = {"t0": 10.0, "t1": 1.0, "t2": 9.0, "t3": 1.0, "t4": 3.0}
    assert ps.place(costs, 2, "mod") == {"t0": 0, "t1": 1, "t2": 0, "t3": 1, "t4": 0}
    assert ps.shard_loads(costs, ps.place(costs, 2, "mod"), 2) == [22.0, 2.0]
    # LPT, largest first onto the least loaded: t0 -> 0, t2 -> 1, t4 -> 1, t1 -> 0, t3 -> 0
    packed = ps.place(costs, 2, "binpack")
    assert packed == {"t0": 0, "t2": 1, "t4": 1, "t1": 0, "t3": 0}
    assert ps.shard_loads(costs, packed, 2) == [12.0, 12.0]
    with pytest.raises(ValueError, match="placement"):
        ps.place(costs, 2, "random")


def test_profile_costs_count_unique_rows():
    layout, batch, _ = setup()
    costs = ps.profile_costs(layout, [batch, batch])
    n_b = len(np.unique(batch.ids[:, 1]))
    assert costs["emb/b"] == n_b * 4 * 4 * 2 and costs["wide/b"] == n_b * 1 * 4 * 2
    jax.block_until_ready(costs)


def test_ps_messages_are_values():
    """pull/push/snapshot/restore never hand out or keep a caller's object (DESIGN.md 4.2):
    writing into what a PS returned, or into what was given to it, changes nothing inside."""
    layout, batch, tables = setup()
    opt = make_sparse_optimizer(SparseOptimConfig("sgd", lr=0.5))
    store = ps.EmbeddingPS(layout, tables, {k: () for k in tables}, opt,
                           {t.name: 0 for t in layout.tables}, 1)
    _, rows = ps.localize(layout, batch)
    pulled = store.pull(rows)
    before = {k: v.copy() for k, v in store.snapshot()[0].items()}
    for v in pulled.values():
        v += 1.0
    snap_t, snap_s = store.snapshot()
    for v in snap_t.values():
        v *= 3.0
    for k in tables:
        tables[k] += 7.0  # the arrays the PS was built from
    np.testing.assert_equal(store.snapshot()[0], before)
    store.restore(snap_t, snap_s)  # restore copies: later writes to snap_t stay outside
    for v in snap_t.values():
        v[:] = 0.0
    np.testing.assert_equal(store.snapshot()[0], {k: 3.0 * v for k, v in before.items()})

    w0 = {"w": jnp.ones(3)}
    sps = ps.SyncPS({"w": jnp.zeros(3)}, lambda a, b: (jax.tree.map(lambda x, y: (x + y) / 2, a, b),
                                                       jax.tree.map(lambda x, y: (x + y) / 2, b, a)))
    w1 = sps.exchange(w0)
    np.testing.assert_array_equal(w0["w"], np.ones(3))  # the caller's replica is untouched
    np.testing.assert_array_equal(w1["w"], 0.5 * np.ones(3))
    np.testing.assert_array_equal(sps.snapshot()["w"], 0.5 * np.ones(3))

    dps = ps.DensePS({"w": jnp.zeros(2)}, (), lambda p, o, g: ({"w": p["w"] - g["w"]}, o))
    saved = dps.snapshot()
    dps.push({"w": jnp.ones(2)}, 0)
    np.testing.assert_array_equal(dps.pull()[0]["w"], -np.ones(2))
    dps.restore(*saved)
    np.testing.assert_array_equal(dps.pull()[0]["w"], np.zeros(2))
