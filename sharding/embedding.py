"""Embedding tables placed on a mesh by sharding type, and their lookup/update inside `shard_map`.

A plan turns the reference tables (``name -> f32[V, D]``, `recjax.embeddings`) into *stores*,
the arrays that live on the mesh:

* ``replicated`` (data_parallel): the table itself, ``P()``;
* ``rows`` (row_wise, table_wise): ``f32[M * R, D]`` split into M blocks of R rows on the table
  axis. The tables of a group are *fused* (torchrec's fused tables): one store for the
  table-wise tables, where shard m's block holds the tables placed on m back to back, and one
  for the row-wise tables, where shard m's block holds the m-th ``ceil(V / M)`` rows of each;
  a `Member` says where each table's rows are;
* ``columns`` (column_wise): the table, its D columns split on the table axis, ``P(None, ax)``.

Lookup and update reuse `recjax.embeddings.lookup`, `row_gradients` and the sparse optimizer
on each device's local block: ids not held by the device get pooling weight 0 (their partial
result is 0 and their row gradient is dropped), and one collective per group recombines the
partial activations (``psum`` over the table axis; ``psum_scatter`` when the table axis also
splits the batch; ``all_gather``/``all_to_all`` of the column blocks for column_wise).

The update sees the *global* batch (ids, weights and activation gradients all-gathered over
the data axis), so every optimizer, including the non-linear ones that merge duplicate ids,
updates exactly the rows the single-device step updates, with the same summed gradients.

This is the *masked* path: simple, exact, and M times the sparse work on M shards. Sync's
step routes the ``rows`` stores' ids to their owners instead (`sharding.routing`) and keeps
this path as its fallback and for the other kinds.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from recjax.embeddings import EmbeddingLayout, TableConfig, lookup, row_gradients


@dataclasses.dataclass(frozen=True)
class Store:
    """One array of the sharded state.

    Attributes:
      key: its name in the sharded tables dict (a table name, or ``"{group}/@table_wise"``,
        ``"{group}/@row_wise"``).
      kind: replicated | rows | columns.
      group: activation group the tables feed.
      rows: R, rows held per device (replicated, columns: V).
      dim: Dg, the full embedding dim of the group.
      members: the tables in the store, as `Member` s.
    """

    key: str
    kind: str
    group: str
    rows: int
    dim: int
    members: tuple[Member, ...]


class Member(NamedTuple):
    """Where a table's rows are in a store: row r is on shard ``shard + r // span``, at row
    ``offset + r % span`` of that shard's block of R rows. A table-wise table has
    ``span = V`` (all on one shard); a row-wise one ``shard = 0, span = ceil(V / M)``;
    replicated and column-wise stores hold one table, ``(t, 0, V, 0)``.
    """

    table: TableConfig
    shard: int
    span: int
    offset: int

    def store_rows(self, r, n_rows: int):
        """Global store row of table row(s) r (numpy or jax) in a store of R = n_rows."""
        return (self.shard + r // self.span) * n_rows + self.offset + r % self.span


@dataclasses.dataclass(frozen=True)
class EmbeddingPlan:
    """Where every table lives.

    Attributes:
      stores: the sharded arrays.
      axis: mesh axis the tables are split over (M = ``n_shards``).
      n_shards: M.
      batch_axis: mesh axis the batch is split over.
      n_batch: size of the batch axis.
      pooling: sum | mean (from the layout).
      kinds: table name -> its sharding type (for summary.json).
    """

    stores: tuple[Store, ...]
    axis: str
    n_shards: int
    batch_axis: str
    n_batch: int
    pooling: str
    kinds: dict

    @property
    def same_axis(self) -> bool:
        """The table axis also splits the batch (a 1-D mesh): lookups gather ids first."""
        return self.axis == self.batch_axis

    def local_dim(self, s: Store) -> int:
        return s.dim // self.n_shards if s.kind == "columns" else s.dim


def _table_wise(tables: list[TableConfig], m: int) -> tuple[int, list[Member]]:
    """Greedy largest-first placement on the least-loaded shard; (R, members)."""
    load, out = [0] * m, {}
    for t in sorted(tables, key=lambda t: -t.num_embeddings):
        s = int(np.argmin(load))
        out[t.name] = Member(t, s, t.num_embeddings, load[s])
        load[s] += t.num_embeddings
    return max(max(load), 1), [out[t.name] for t in tables]


def _row_wise(tables: list[TableConfig], m: int) -> tuple[int, list[Member]]:
    """Every table split in M even row blocks; shard k's block holds block k of each, back to
    back (torchrec's row-wise tables, fused)."""
    out, off = [], 0
    for t in tables:
        span = -(-t.num_embeddings // m)
        out.append(Member(t, 0, span, off))
        off += span
    return max(off, 1), out


def make_plan(layout: EmbeddingLayout, kinds: dict[str, str], axis: str, n_shards: int,
              batch_axis: str, n_batch: int, sparse_opt: str) -> EmbeddingPlan:
    """Stores for `layout` with each table's sharding type from `kinds`. The row-wise tables of
    an activation group are fused into one store, and so are its table-wise tables.

    Raises:
      ValueError: column_wise with D not divisible by the table axis, or with an optimizer whose
        row state couples the columns (rowwise_adagrad).
    """
    stores, m = [], n_shards
    for group, dim in layout.groups:
        fused = {"table_wise": [], "row_wise": []}
        for t in layout.group_tables(group):
            kind = kinds[t.name]
            whole = (Member(t, 0, t.num_embeddings, 0),)
            if kind == "data_parallel":
                stores.append(Store(t.name, "replicated", group, t.num_embeddings, dim, whole))
            elif kind == "column_wise":
                if dim % m:
                    raise ValueError(f"table {t.name}: column_wise needs the embedding dim ({dim}) "
                                     f"divisible by the table axis ({m}); choose another "
                                     "--model.embed_dim, mesh or sharding type")
                if sparse_opt == "rowwise_adagrad":
                    raise ValueError(f"table {t.name}: column_wise cannot split rowwise_adagrad's "
                                     "one-per-row accumulator; use row_wise/table_wise or "
                                     "--sparse.name=adagrad")
                stores.append(Store(t.name, "columns", group, t.num_embeddings, dim, whole))
            else:
                fused[kind].append(t)
        for kind, place in (("table_wise", _table_wise), ("row_wise", _row_wise)):
            if fused[kind]:
                r, members = place(fused[kind], m)
                stores.append(Store(f"{group}/@{kind}", "rows", group, r, dim, tuple(members)))
    pooling = layout.tables[0].pooling
    return EmbeddingPlan(tuple(stores), axis, m, batch_axis, n_batch, pooling, dict(kinds))


# ---- placement: reference tables <-> stores (host side, numpy) --------------------------------


def to_stores(plan: EmbeddingPlan, by_table: dict) -> dict:
    """``table name -> pytree of arrays with leading dim V`` (tables or slots) -> ``key -> store``."""
    out = {}
    for s in plan.stores:
        trees = [jax.tree.map(np.asarray, by_table[m.table.name]) for m in s.members]
        if s.kind != "rows":
            out[s.key] = trees[0]
            continue

        def fuse(*leaves, s=s):
            buf = np.zeros((s.rows * plan.n_shards,) + leaves[0].shape[1:], leaves[0].dtype)
            for m, leaf in zip(s.members, leaves):
                buf[m.store_rows(np.arange(m.table.num_embeddings), s.rows)] = leaf
            return buf

        out[s.key] = jax.tree.map(fuse, *trees)
    return out


def from_stores(plan: EmbeddingPlan, stores: dict) -> dict:
    """Inverse of `to_stores`: host numpy trees per reference table name."""
    out = {}
    for s in plan.stores:
        tree = jax.tree.map(np.asarray, stores[s.key])
        for m in s.members:
            rows = m.store_rows(np.arange(m.table.num_embeddings), s.rows)
            out[m.table.name] = (tree if s.kind != "rows" else
                                 jax.tree.map(lambda x, rows=rows: x[rows], tree))
    return out


def to_stores_jnp(plan: EmbeddingPlan, by_table: dict) -> dict:
    """`to_stores` in jax.numpy, by blocks (no gather): jitted over global arrays with the
    stores' shardings as its outputs, each device builds its own block where the arrays are
    (a multi-process checkpoint restored onto this mesh, `sharding.spmd`). Same values."""
    m_ = plan.n_shards
    out = {}
    for s in plan.stores:
        trees = [by_table[m.table.name] for m in s.members]
        if s.kind != "rows":
            out[s.key] = trees[0]
            continue

        def fuse(*leaves, s=s):
            tail = leaves[0].shape[1:]
            buf = jnp.zeros((m_, s.rows) + tail, leaves[0].dtype)
            for m, leaf in zip(s.members, leaves):
                k = -(-m.table.num_embeddings // m.span)  # the shards holding its rows
                pad = [(0, k * m.span - m.table.num_embeddings)] + [(0, 0)] * len(tail)
                blocks = jnp.pad(leaf, pad).reshape((k, m.span) + tail)
                buf = buf.at[m.shard:m.shard + k, m.offset:m.offset + m.span].set(blocks)
            return buf.reshape((m_ * s.rows,) + tail)

        out[s.key] = jax.tree.map(fuse, *trees)
    return out


def from_stores_jnp(plan: EmbeddingPlan, stores: dict) -> dict:
    """`from_stores` in jax.numpy, by blocks (for a jit over global arrays: a multi-process
    checkpoint is written from where the shards are, `sharding.spmd`). Same values."""
    out = {}
    for s in plan.stores:
        for m in s.members:
            if s.kind != "rows":
                out[m.table.name] = stores[s.key]
                continue

            def take(x, m=m, s=s):
                tail = x.shape[1:]
                k = -(-m.table.num_embeddings // m.span)
                blocks = x.reshape((plan.n_shards, s.rows) + tail)[
                    m.shard:m.shard + k, m.offset:m.offset + m.span]
                return blocks.reshape((k * m.span,) + tail)[:m.table.num_embeddings]

            out[m.table.name] = jax.tree.map(take, stores[s.key])
    return out


def store_specs(plan: EmbeddingPlan, stores: dict) -> dict:
    """PartitionSpec of every leaf of `stores` (tables or slot trees)."""

    def spec(s: Store, leaf):
        if s.kind == "rows":
            return P(plan.axis)
        if s.kind == "columns" and len(getattr(leaf, "shape", np.shape(leaf))) == 2:
            return P(None, plan.axis)
        return P()

    return {s.key: jax.tree.map(lambda x, s=s: spec(s, x), stores[s.key]) for s in plan.stores}


# ---- inside shard_map ----------------------------------------------------------------------


def pool_weights(plan: EmbeddingPlan, ids: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Per-id pooling weights f32[b, F, L]: the mask (1 if None), / count for mean pooling."""
    w = jnp.ones(ids.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
    if plan.pooling == "mean":
        w = w / jnp.maximum(w.sum(-1, keepdims=True), 1.0)
    return w


def _local(plan: EmbeddingPlan, s: Store, m: Member, ids, w):
    """Ids of m's table as rows of this device's block of `s`, and weights zeroed where not held."""
    idx = m.table.field_index
    local, ww = ids[:, idx, :], w[:, idx, :]
    if s.kind == "rows":
        held = m.shard + local // m.span == jax.lax.axis_index(plan.axis)
        local, ww = m.offset + local % m.span, ww * held.astype(ww.dtype)
    one = TableConfig(s.key, s.rows, plan.local_dim(s), (), tuple(range(len(idx))), "sum")
    return EmbeddingLayout(((s.group, plan.local_dim(s)),), (one,), len(idx)), local, ww


def _assemble(parts: list[tuple[tuple[int, ...], jax.Array]]) -> jax.Array:
    order = [i for idx, _ in parts for i in idx]
    stacked = jnp.concatenate([a for _, a in parts], axis=1) if len(parts) > 1 else parts[0][1]
    return stacked if order == sorted(order) else stacked[:, np.argsort(order), :]


def split_rows(plan: EmbeddingPlan, b: int) -> bool:
    """On a 2-D mesh, whether the lookup hands each table-axis shard its own ``b / M`` of the
    data shard's ``b`` examples (the dense network then runs on distinct rows on every device,
    not twice on the same rows). A 1-D mesh needs no split: its table axis is the batch axis."""
    return not plan.same_axis and plan.n_shards > 1 and b % plan.n_shards == 0


def my_rows(plan: EmbeddingPlan, x: jax.Array) -> jax.Array:
    """This table-axis shard's ``b / M`` rows of an array replicated over the table axis."""
    n = x.shape[0] // plan.n_shards
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(plan.axis) * n, n)


def sharded_lookup(plan: EmbeddingPlan, stores: dict, ids: jax.Array, mask,
                   split: bool = False, routed: dict | None = None) -> dict:
    """Pooled activations ``group -> f32[b, F, Dg]`` of the local batch (equal to `lookup`).

    With ``split`` (`split_rows`) on a 2-D mesh: ``f32[b / M, F, Dg]``, this table-axis shard's
    rows (`my_rows`); the row blocks are reduce-scattered instead of all-reduced.
    ``routed``: store key -> its activations ``[b, store fields, Dg]``, already looked up by
    owner routing (`sharding.routing`); those stores are skipped here.
    """
    routed = routed or {}
    w = pool_weights(plan, ids, mask)
    ax, bx = plan.axis, plan.batch_axis
    ids_g, w_g = ids, w
    if plan.same_axis and any(s.kind != "replicated" and s.key not in routed for s in plan.stores):
        ids_g = jax.lax.all_gather(ids, bx, axis=0, tiled=True)
        w_g = jax.lax.all_gather(w, bx, axis=0, tiled=True)
    mine = (lambda x: my_rows(plan, x)) if split else (lambda x: x)
    acts = {}
    for group in dict.fromkeys(s.group for s in plan.stores):
        parts, rows, cols = [], [], []
        for s in (s for s in plan.stores if s.group == group):
            if s.key in routed:
                parts.append((tuple(i for m in s.members for i in m.table.field_index),
                              routed[s.key]))
                continue
            for m in s.members:
                on = (ids, w) if s.kind == "replicated" else (ids_g, w_g)
                layout, local, ww = _local(plan, s, m, *on)
                a = lookup(layout, {s.key: stores[s.key]}, local, ww)[group]
                if s.kind == "replicated":
                    a = mine(a)
                {"replicated": parts, "rows": rows, "columns": cols}[s.kind].append((m.table.field_index, a))
        if rows:  # partial sums over the row blocks -> the full pooled rows
            x = jnp.concatenate([a for _, a in rows], axis=1)
            x = (jax.lax.psum_scatter(x, bx if plan.same_axis else ax, scatter_dimension=0,
                                      tiled=True) if plan.same_axis or split
                 else jax.lax.psum(x, ax))
            parts.append((tuple(i for idx, _ in rows for i in idx), x))
        if cols:  # column blocks -> full width
            x = jnp.concatenate([a for _, a in cols], axis=1)
            x = (jax.lax.all_to_all(x, bx, 0, 2, tiled=True) if plan.same_axis
                 else mine(jax.lax.all_gather(x, ax, axis=2, tiled=True, to="invarying")))
            parts.append((tuple(i for idx, _ in cols for i in idx), x))
        acts[group] = _assemble(parts)
    return acts


def sharded_update(plan: EmbeddingPlan, opt, stores: dict, slots: dict, ids_all: jax.Array,
                   w_all: jax.Array, g_all: dict, step: jax.Array,
                   routed: dict | None = None) -> tuple[dict, dict]:
    """Apply the global batch's activation gradients to the rows/columns this device holds.

    Args:
      ids_all, w_all: i32/f32[B, F, L] ids and pooling weights of the whole global batch
        (None when every store is routed).
      g_all: ``group -> f32[B, F, Dg]`` gradient of the global loss w.r.t. the activations.
      routed: store key -> ``(store, slots)`` already updated by owner routing.
    """
    new_stores, new_slots = {}, {}
    for s in plan.stores:
        if routed and s.key in routed:
            new_stores[s.key], new_slots[s.key] = routed[s.key]
            continue
        all_ids, all_g = [], []
        for m in s.members:
            layout, local, ww = _local(plan, s, m, ids_all, w_all)
            g = g_all[s.group][:, m.table.field_index, :]
            if s.kind == "columns":
                d = plan.local_dim(s)
                g = jax.lax.dynamic_slice_in_dim(g, jax.lax.axis_index(plan.axis) * d, d, axis=2)
            rid, rg = row_gradients(layout, {s.group: g}, local, ww)[s.key]
            all_ids.append(rid)
            all_g.append(rg)
        new_stores[s.key], new_slots[s.key] = opt.update(
            stores[s.key], slots[s.key], jnp.concatenate(all_ids), jnp.concatenate(all_g), step)
    return new_stores, new_slots
