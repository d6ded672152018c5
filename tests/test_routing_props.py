"""Owner routing (sharding/routing.py) on 8 fake CPU devices, for any capacity and id mix.

Property: for every route capacity factor and every batch, including ids exactly at shard
boundaries and heavily skewed batches, each row store's routed lookup equals the single-device
lookup (exactly: rank-coded tables), or the store's overflow flag is raised; and the flag is
raised exactly when some (source, owner) pair has more distinct rows than the capacity C, as
the module documents. Both sides are written out here in numpy: the pooled lookup, and the
capacity test from the placement (row-wise: owner ``id // ceil(V / M)``; table-wise: the
table's shard) and ``C = max(1, min(E, ceil(factor * E / M)))``.
"""

import functools
import math

import jax
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from recjax.embeddings import make_layout
from recjax.features import FeatureSpec, FieldSpec
from sharding import embedding, routing
from sharding.mesh import make_mesh

M, B_LOCAL, D = 8, 2, 2  # shards (= data shards on the 1-D mesh), examples per device, dim
B = M * B_LOCAL
# a and c share the row-wise table "ac" (64 rows: span 8, boundaries at 8k); b is row-wise with
# 21 rows (span 3; the last shard holds none); t is table-wise (13 rows on one shard).
SPEC = FeatureSpec((), (FieldSpec("a", 64, max_len=2, table="ac"), FieldSpec("b", 21, max_len=2),
                        FieldSpec("c", 64, max_len=2, table="ac"), FieldSpec("t", 13, max_len=2)))
KINDS = {"emb/ac": "row_wise", "emb/b": "row_wise", "emb/t": "table_wise"}
FACTORS = (0.05, 0.5, 1.0, 1.25, 1.5, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 8.0)
PROPS = settings(database=None, derandomize=True, deadline=None, max_examples=150)


@functools.cache
def _setup():
    layout = make_layout(SPEC, {"emb": D})
    plan = embedding.make_plan(layout, KINDS, "data", M, "data", M, "sgd")
    mesh = make_mesh({"data": M})
    tables = {t.name: (1000.0 * (i + 1) + np.arange(t.num_embeddings)[:, None]
                       + np.arange(D)[None, :] / 8.0).astype(np.float32)
              for i, t in enumerate(layout.tables)}
    stores = embedding.to_stores(plan, tables)
    specs = embedding.store_specs(plan, stores)
    placed = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in stores.items()}
    return layout, plan, mesh, tables, placed, specs


@functools.cache
def _routed_lookup(factor: float):
    """jit(shard_map) of every row store's routed lookup and overflow flag (one compile per C)."""
    _, plan, mesh, _, _, specs = _setup()
    rows = [s for s in plan.stores if s.kind == "rows"]

    def body(stores, ids, mask):
        w = embedding.pool_weights(plan, ids, mask)
        acts, flags = {}, {}
        for s in rows:
            r = routing.make_route(plan, s, ids, w, factor)
            acts[s.key] = routing.lookup(plan, s, stores[s.key], r, B_LOCAL)
            flags[s.key] = r.over
        return acts, flags

    return jax.jit(jax.shard_map(
        body, mesh=mesh, in_specs=(specs, P("data"), P("data")),
        out_specs=({s.key: P("data") for s in rows}, {s.key: P() for s in rows})))


def _store_fields(s) -> list[int]:
    return [i for m in s.members for i in m.table.field_index]


def _want(tables, s, ids, mask) -> np.ndarray:
    """Single-device pooled rows [B, store fields, D]: sum over l of mask * table[id]."""
    out = []
    for m in s.members:
        t = tables[m.table.name].astype(np.float64)
        for f in m.table.field_index:
            out.append(np.einsum("bld,bl->bd", t[ids[:, f, :]], mask[:, f, :]))
    return np.stack(out, 1)


def _over(s, ids, mask, factor) -> bool:
    """Some (source device, owner shard) pair with more distinct held rows than C."""
    e = B_LOCAL * len(_store_fields(s)) * SPEC.max_len
    c = max(1, min(e, math.ceil(factor * e / M)))
    for src in range(M):
        mine = slice(src * B_LOCAL, (src + 1) * B_LOCAL)
        keys = set()
        for m in s.members:
            t = m.table
            for f in t.field_index:
                for i in ids[mine, f, :][mask[mine, f, :] > 0]:
                    owner = (int(i) // -(-t.num_embeddings // M) if KINDS[t.name] == "row_wise"
                             else m.shard)
                    keys.add((owner, t.name, int(i)))
        per_owner = np.bincount([k[0] for k in keys], minlength=M)
        if per_owner.max(initial=0) > c:
            return True
    return False


def _batch(seed: int, boundary: float, skew: float, focus: float, fill: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """ids i32[B, F, L] mixing, per entry: rows of one owner shard chosen per device (`focus`:
    fills that owner's slots up to and past C), shard-boundary ids (k*span - 1, k*span,
    k*span + 1), a few hot ids (`skew`) and uniform ones; mask with about `fill` of the entries
    held (at least one per field and example)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, SPEC.n_fields, SPEC.max_len), np.int32)
    owner = np.repeat(rng.integers(0, M, M), B_LOCAL)[:, None]  # each device's focus shard
    for f, field in enumerate(SPEC.fields):
        v = field.vocab_size
        span = -(-v // M) if KINDS[f"emb/{field.table}"] == "row_wise" else v
        edges = np.unique(np.clip(np.arange(0, v + span, span)[:, None] + [-1, 0, 1], 0, v - 1))
        hot = rng.choice(edges, size=2)
        shape = ids[:, f].shape
        focused = np.minimum((owner % -(-v // span)) * span + rng.integers(0, span, shape), v - 1)
        u = rng.random(shape)
        ids[:, f] = np.select([u < focus, u < focus + boundary, u < focus + boundary + skew],
                              [focused, rng.choice(edges, shape), rng.choice(hot, shape)],
                              rng.integers(0, v, shape))
    mask = (rng.random(ids.shape) < fill).astype(np.float32)
    mask[:, :, 0] = 1.0
    return ids, mask


def _check(factor, seed, focus, boundary, skew, fill):
    _, plan, _, tables, placed, _ = _setup()
    ids, mask = _batch(seed, boundary, skew, focus, fill)
    acts, flags = _routed_lookup(factor)(placed, ids, mask)
    any_over = False
    for s in (s for s in plan.stores if s.kind == "rows"):
        over = _over(s, ids, mask, factor)
        any_over |= over
        if not bool(flags[s.key]):
            np.testing.assert_array_equal(np.asarray(acts[s.key]), _want(tables, s, ids, mask),
                                          err_msg=f"{s.key} factor={factor}: wrong rows, no flag")
        assert bool(flags[s.key]) == over, (s.key, factor)
    # the trainer's host-side count of over-capacity batches (summary.json) agrees
    assert routing.host_over(plan, ids, mask, factor, M) == any_over


BATCHES = dict(seed=st.integers(0, 2**32 - 1), focus=st.floats(0, 1), boundary=st.floats(0, 1),
               skew=st.floats(0, 1), fill=st.floats(0, 1))


@settings(PROPS, max_examples=60)
@given(factor=st.sampled_from((1.0, 2.5, 3.0)), **BATCHES)
# found by the property against the bug below: wrong rows in both stores, no flag
@example(factor=2.5, seed=2, focus=0.0, boundary=0.75, skew=0.25, fill=1.0)
@example(factor=3.0, seed=0, focus=0.0, boundary=1.0, skew=0.25, fill=1.0)
def test_routed_lookup_is_exact_or_flagged(factor, seed, focus, boundary, skew, fill):
    """The quick form (3 capacities, 3 compiles; the full grid is the slow test below).

    Bug reproduction (issue 14): owner routing off by one at a shard boundary,

        routing.make_route:  start = jnp.searchsorted(uniq, jnp.arange(m_ + 1) * r, side="right")

    (the id at an owner's first row counted in the previous owner's slots) returned wrong
    embedding rows for 16 of 300 random batches at route capacity 2.5-3.0, with no flag raised.
    This generator reproduces that rate (14 and 22 of 300 at 2.5 and 3.0), and the flag is
    wrong for over a third of them.
    """
    _check(factor, seed, focus, boundary, skew, fill)


@pytest.mark.slow
@settings(PROPS, max_examples=400)
@given(factor=st.sampled_from(FACTORS), **BATCHES)
def test_routed_lookup_is_exact_or_flagged_every_capacity(factor, seed, focus, boundary, skew, fill):
    """The property over the whole capacity grid, 0.05 (C = 1) to 8 (C = every entry)."""
    _check(factor, seed, focus, boundary, skew, fill)


def test_capacity_formula():
    """C = factor x the even share E / M, rounded up, at least 1 and at most E."""
    for e, m, factor, c in [(24, 8, 2.5, 8), (24, 8, 3.0, 9), (24, 8, 0.01, 1), (24, 8, 100.0, 24),
                            (7, 8, 1.0, 1), (8, 8, 1.25, 2)]:
        assert routing.capacity(e, m, factor) == c, (e, m, factor)


def test_setup_has_ids_at_boundaries():
    """The placement the property relies on: row-wise spans 8 and 3, boundary at id 8 of "ac"."""
    _, plan, *_ = _setup()
    rw = next(s for s in plan.stores if s.key == "emb/@row_wise")
    spans = {m.table.name: m.span for m in rw.members}
    assert spans == {"emb/ac": 8, "emb/b": 3}
    ac = next(m for m in rw.members if m.table.name == "emb/ac")
    assert ac.store_rows(np.array([7, 8]), rw.rows).tolist() == [7, rw.rows]
