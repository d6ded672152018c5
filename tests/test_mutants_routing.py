"""sharding/routing.py: the cases mutation testing found unpinned (docs/testing.md).

* `routable` says no whenever one of its conditions fails (only its yes was tested).
* `update`, called directly on 8 fake CPU devices, equals SGD on the single-device tables
  written out in numpy (every entry's ``-lr * w * g`` added to its row), exactly: rank-coded
  tables and gradients in multiples of 1/8 keep every sum exact in float32. On the 2-D mesh
  with a data axis of 2 (test_sync's meshes have 4), a row block's replicas over data must
  gather the other data group's gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from recjax.embeddings import SparseOptimConfig, make_layout, make_sparse_optimizer
from sharding import embedding, routing
from sharding.mesh import make_mesh
from tests import test_routing_props as props

D, B, LR = 2, 16, 0.5  # as in test_routing_props (B = 8 devices x 2)
# the props test's fields: "ac" (64 rows, span 8) shared by a and c, b (21 rows), t table-wise;
# every store is a row store ("rows"), so every one routes
SPEC, KINDS = props.SPEC, props.KINDS


def _plan(axis, m, n_batch, kinds=KINDS, spec=SPEC):
    return embedding.make_plan(make_layout(spec, {"emb": D}), kinds, axis, m, "data", n_batch, "sgd")


def test_routable_truth_table():
    """Routing needs a positive capacity factor, more than one table shard, a row store, and
    the table axis being the batch axis or splitting the data shard's rows evenly. Kills
    ``and -> or``, ``> -> >=`` and ``== "rows" -> != "rows"`` in `routable` (routing.py:65-66)."""
    one_d, two_d = _plan("data", 8, 8), _plan("model", 4, 2)
    assert routing.routable(one_d, 1.0, 2) and routing.routable(two_d, 1.0, 8)
    assert not routing.routable(one_d, 0.0, 2)  # factor 0: route nothing
    assert not routing.routable(one_d, -1.0, 2)
    assert not routing.routable(_plan("data", 1, 1), 1.0, 16)  # one shard holds every row
    assert not routing.routable(_plan("model", 1, 8), 1.0, 2)
    replicated = {"emb/ac": "data_parallel", "emb/b": "column_wise", "emb/t": "data_parallel"}
    assert not routing.routable(_plan("data", 2, 2, replicated), 1.0, 8)  # no row store
    assert not routing.routable(two_d, 1.0, 6)  # 6 rows do not split over 4 model shards
    mixed = dict(replicated, **{"emb/t": "table_wise"})  # one row store among others: routes it
    assert routing.routable(_plan("data", 2, 2, mixed), 1.0, 8)


MESHES = {"1-D data=8": ({"data": 8}, "data", 8, 8), "2-D data=2,model=4": ({"data": 2, "model": 4},
                                                                             "model", 4, 2)}


@functools.cache
def _routed(mesh_name: str, opt_cfg: SparseOptimConfig, pooling: str = "sum", step: int = 0):
    """``f(stores, slots, ids, mask, g) -> (stores, slots, over)``: `routing.update` of every
    row store on `mesh_name`'s 8 fake devices (C = every entry), with the slots sharded like
    the rows; also ``layout, plan, mesh, specs``."""
    sizes, axis, m, n_batch = MESHES[mesh_name]
    layout = make_layout(SPEC, {"emb": D}, pooling=pooling)
    plan = embedding.make_plan(layout, KINDS, axis, m, "data", n_batch, opt_cfg.name)
    mesh, opt = make_mesh(sizes), make_sparse_optimizer(opt_cfg)
    rows = [s for s in plan.stores if s.kind == "rows"]
    b = B // n_batch  # a data shard's examples
    split = embedding.split_rows(plan, b)
    mine = (lambda x: embedding.my_rows(plan, x)) if split else (lambda x: x)
    specs = {s.key: P(axis) for s in rows}

    def body(stores, slots, ids, mask, g):
        w = embedding.pool_weights(plan, ids, mask)
        new, new_slots, over = {}, {}, []
        for s in rows:
            r = routing.make_route(plan, s, mine(ids), mine(w), 8.0)  # C = every entry
            new[s.key], new_slots[s.key] = routing.update(plan, opt, s, stores[s.key],
                                                          slots[s.key], r, g, jnp.int32(step))
            over.append(r.over)
        return new, new_slots, jnp.any(jnp.stack(over))

    g_spec = P(("data", axis)) if split else P("data")  # each device's own rows
    f = jax.jit(jax.shard_map(body, mesh=mesh,
                              in_specs=(specs, specs, P("data"), P("data"), g_spec),
                              out_specs=(specs, specs, P())))
    return layout, plan, mesh, specs, f


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_routed_update_equals_sgd_on_the_reference_tables(mesh_name):
    """Kills ``n_batch > 1 -> n_batch > 2`` in `update` (routing.py:129): with 2 data groups the
    replicas of a row block would each miss the other group's gradients."""
    layout, plan, mesh, specs, f = _routed(mesh_name, SparseOptimConfig("sgd", lr=LR))
    tables = {t.name: (1000.0 * (i + 1) + np.arange(t.num_embeddings)[:, None]
                       + np.arange(D)[None, :] / 8.0).astype(np.float32)
              for i, t in enumerate(layout.tables)}
    stores = embedding.to_stores(plan, tables)
    placed = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in stores.items()}
    rng = np.random.default_rng(0)
    for _ in range(4):
        ids = np.stack([rng.integers(0, fs.vocab_size, (B, 2)) for fs in SPEC.fields], 1)
        ids[:4, 0, :] = [[7, 8], [8, 8], [15, 16], [63, 0]]  # shard boundaries of "ac" (span 8)
        mask = (rng.random(ids.shape) < 0.8).astype(np.float32)
        g = (rng.integers(-3, 4, (B, SPEC.n_fields, D)) / 4).astype(np.float32)
        new, _, over = f(placed, {k: () for k in placed}, ids.astype(np.int32), mask, g)
        assert not bool(over)
        want = {k: v.copy() for k, v in tables.items()}
        for t in layout.tables:  # SGD on the dense gradient: every entry adds -lr * w * g
            for fi in t.field_index:
                for bi in range(B):
                    for li in range(2):
                        want[t.name][ids[bi, fi, li]] -= LR * mask[bi, fi, li] * g[bi, fi]
        got = embedding.from_stores(plan, new)
        for name in tables:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} on {mesh_name}")


def test_the_last_owner_counts_its_slots_from_its_own_start():
    """Each device asks shard 6 of table "ac" for 4 rows and shard 7 (the last) for 4 others:
    neither exceeds C = ceil(3.0 * 12 / 8) = 5, so the lookup routes, no flag, and must be
    exact. Kills ``start[min(owner, m_ - 1)] -> start[min(owner, m_ - 2)]`` (routing.py:94):
    the last owner's positions would count from shard 6's start (4, 5, 6, 7) and the rows past
    C would read zeros, unflagged. The props test's random batches never filled both."""
    _, plan, _, tables, placed, _ = props._setup()  # the props test's tables (same SPEC)
    ids = np.zeros((B, SPEC.n_fields, 2), np.int32)
    ids[:, 0] = np.array([48, 49, 50, 51]).reshape(2, 2)[np.arange(B) % 2]  # a: shard 6
    ids[:, 2] = np.array([56, 57, 58, 59]).reshape(2, 2)[np.arange(B) % 2]  # c: shard 7
    ids[:, 3] = np.arange(B)[:, None] % 13  # t: table-wise
    mask = np.ones(ids.shape, np.float32)
    acts, flags = props._routed_lookup(3.0)(placed, ids, mask)
    for s in (s for s in plan.stores if s.kind == "rows"):
        assert not props._over(s, ids, mask, 3.0) and not bool(flags[s.key])
        np.testing.assert_array_equal(np.asarray(acts[s.key]), props._want(tables, s, ids, mask),
                                      err_msg=s.key)


def test_host_over_checks_row_stores_after_other_stores():
    """`host_over` skips replicated stores and goes on to the row stores after them
    (kills ``continue -> break``, routing.py:142). Here the only row store, table-wise "t",
    comes last; each device's 2 examples x 2 ids are E = 4 entries, C = max(1, ceil(0.05 x 4 /
    8)) = 1 row per (source, owner): two distinct t ids on a device exceed it, one does not."""
    mixed = {"emb/ac": "data_parallel", "emb/b": "data_parallel", "emb/t": "table_wise"}
    plan = _plan("data", 8, 8, mixed)
    assert [s.kind for s in plan.stores] == ["replicated", "replicated", "rows"]
    ids = np.zeros((B, SPEC.n_fields, 2), np.int32)
    ids[:, 3] = 5
    assert not routing.host_over(plan, ids, None, 0.05, 8)
    ids[1, 3, 1] = 6  # device 0 (examples 0 and 1) now asks t's shard for rows 5 and 6
    assert routing.host_over(plan, ids, None, 0.05, 8)
    mask = np.ones(ids.shape, np.float32)
    mask[1, 3, 1] = 0.0  # ...unless the entry is padding
    assert not routing.host_over(plan, ids, mask, 0.05, 8)


B1, B2, EPS, STEP = 0.9, 0.99, 1e-8, 3


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_routed_adam_with_mean_pooling_equals_numpy_lazy_adam(mesh_name):
    """Routed `update` under lazy Adam at step 3, with mean pooling (weights 1/2 where both ids
    of a field are present) and nonzero moments, against lazy Adam in float64 numpy on the
    per-row sums of ``w * g``. Kills ``g * w -> g / w`` (routing.py:122: with mean pooling the
    weights are not 1), ``slots -> None`` and ``step -> None`` in the optimizer call
    (routing.py:132): SGD, the other test's optimizer, reads neither."""
    layout, plan, mesh, specs, f = _routed(
        mesh_name, SparseOptimConfig("adam", lr=LR, b1=B1, b2=B2, eps=EPS), "mean", STEP)
    rng = np.random.default_rng(1)
    tables = {t.name: rng.normal(size=(t.num_embeddings, D)).astype(np.float32)
              for t in layout.tables}
    m0 = {k: rng.normal(scale=0.1, size=v.shape).astype(np.float32) for k, v in tables.items()}
    v0 = {k: rng.uniform(0.01, 0.1, size=v.shape).astype(np.float32) for k, v in tables.items()}
    slots = {k: (m0[k], v0[k]) for k in tables}
    put = lambda tree: {k: jax.device_put(x, NamedSharding(mesh, specs[k]))  # noqa: E731
                        for k, x in tree.items() if k in specs}
    ids = np.stack([rng.integers(0, fs.vocab_size, (B, 2)) for fs in SPEC.fields], 1)
    mask = (rng.random(ids.shape) < 0.8).astype(np.float32)
    mask[:4] = 1.0  # some fields with both ids present: weight 1/2
    g = rng.normal(size=(B, SPEC.n_fields, D)).astype(np.float32)
    new, new_slots, _ = f(put(embedding.to_stores(plan, tables)),
                          put(embedding.to_stores(plan, slots)), ids.astype(np.int32), mask, g)
    got = embedding.from_stores(plan, new)
    got_slots = embedding.from_stores(plan, new_slots)
    w = mask / np.maximum(mask.sum(-1, keepdims=True), 1.0)
    t = STEP + 1
    for tab in layout.tables:  # every table is in a row store (KINDS)
        gsum = np.zeros(tables[tab.name].shape)
        for fi in tab.field_index:
            for bi in range(B):
                for li in range(2):
                    gsum[ids[bi, fi, li]] += w[bi, fi, li] * g[bi, fi].astype(np.float64)
        touched = sorted({int(ids[bi, fi, li]) for fi in tab.field_index for bi in range(B)
                          for li in range(2) if mask[bi, fi, li]})
        want, wm, wv = (x[tab.name].astype(np.float64) for x in (tables, m0, v0))
        gg = gsum[touched]
        wm[touched] = B1 * wm[touched] + (1 - B1) * gg
        wv[touched] = B2 * wv[touched] + (1 - B2) * gg * gg
        want[touched] -= LR * (wm[touched] / (1 - B1**t)) / (
            np.sqrt(wv[touched] / (1 - B2**t)) + EPS)
        np.testing.assert_allclose(got[tab.name], want, rtol=2e-5, atol=2e-6,
                                   err_msg=f"{tab.name} on {mesh_name}")
        np.testing.assert_allclose(got_slots[tab.name][0], wm, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(got_slots[tab.name][1], wv, rtol=2e-5, atol=2e-6)
