"""Owner routing of a row-sharded store's lookups and row gradients (inside `shard_map`).

The masked path of `sharding.embedding` has every device gather (and later scatter) the rows of
the whole global batch, zero-weighted where it does not hold them: M times the sparse work. Here
each device sends only the rows it needs to the shard that holds them, torchrec's input
distribution:

    key      = global store row of each local id (`Member.store_rows`), padding -> sentinel
    uniq     = unique(key)                          sorted, so grouped by owner shard
    send     = [M, C] local rows, uniq's owner-major slots     capacity C per (source, owner)
    recv     = all_to_all(send)                     the rows each source asks of this shard
    rows     = block[recv] -> all_to_all back -> the unique rows -> [b, F, L, D] -> pooled
    (update) per-unique gradient sums -> all_to_all -> owner's optimizer on recv's rows

On a 2-D mesh the entries are those of the device's own ``b / M`` rows (`embedding.split_rows`),
routed over the ``model`` axis inside its data group, and the owner all-gathers the routed
gradients over ``data`` (its block is replicated there). A device handles about ``C * M``
entries (``spmd.route_capacity`` x its local entries, duplicates inside its batch merged before
they are sent) instead of the global batch's.
Owners merge the same row arriving from several sources in the optimizer (`coalesce`), so the
update is the single-device one up to float summation order.

C is static. When any (source, owner) pair has more unique rows than C anywhere on the mesh,
the step takes the masked path instead (`jax.lax.cond` on the all-reduced flag): slower, never
wrong.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sharding import embedding
from sharding.embedding import EmbeddingPlan, Store


class Route(NamedTuple):
    """One store's routing of this device's entries (E = b x store fields x L).

    Attributes:
      inv: i32[E], entry -> its unique slot.
      owner: i32[E], unique slot -> owner shard (M for the padding sentinel).
      pos: i32[E], unique slot -> its place among the owner's slots.
      recv: i32[M, C], rows of this shard's block requested by each source (R = none).
      weight: f32[E], the entries' pooling weights.
      over: bool[], some (source, owner) pair anywhere exceeds C.
    """

    inv: jax.Array
    owner: jax.Array
    pos: jax.Array
    recv: jax.Array
    weight: jax.Array
    over: jax.Array


def routable(plan: EmbeddingPlan, factor: float, b: int) -> bool:
    """Whether a step on data shards of ``b`` examples routes: row stores on a table axis of
    M > 1 shards that is the batch axis (1-D mesh) or splits the data shard's rows
    (`embedding.split_rows`)."""
    return (factor > 0 and plan.n_shards > 1 and any(s.kind == "rows" for s in plan.stores)
            and (plan.same_axis or embedding.split_rows(plan, b)))


def _mesh_axes(plan: EmbeddingPlan) -> tuple[str, ...]:
    return tuple(dict.fromkeys((plan.batch_axis, plan.axis)))


def capacity(n_entries: int, n_shards: int, factor: float) -> int:
    """C, unique rows per (source, owner) pair: ``factor`` x the even share, at most all."""
    return max(1, min(n_entries, math.ceil(factor * n_entries / n_shards)))


def _fields(s: Store) -> tuple[int, ...]:
    return tuple(i for m in s.members for i in m.table.field_index)


def make_route(plan: EmbeddingPlan, s: Store, ids: jax.Array, w: jax.Array, factor: float) -> Route:
    """Route this device's ids ``i32[b, F, L]`` (weights ``w``) of store `s`'s fields."""
    m_, r = plan.n_shards, s.rows
    keys = [m.store_rows(ids[:, m.table.field_index, :], r) for m in s.members]
    weight = jnp.concatenate([w[:, m.table.field_index, :] for m in s.members], axis=1).reshape(-1)
    none = m_ * r
    key = jnp.where(weight != 0, jnp.concatenate(keys, axis=1).reshape(-1), none)
    e = key.shape[0]
    c = capacity(e, m_, factor)
    uniq, inv = jnp.unique(key, size=e, fill_value=none, return_inverse=True)
    start = jnp.searchsorted(uniq, jnp.arange(m_ + 1) * r)  # owner k's slots: start[k]:start[k+1]
    owner = uniq // r
    pos = jnp.arange(e) - start[jnp.minimum(owner, m_ - 1)]
    ok = (owner < m_) & (pos < c)
    send = jnp.full((m_, c), r, jnp.int32).at[jnp.where(ok, owner, m_), pos].set(
        uniq % r, mode="drop")
    over = jax.lax.psum(jnp.any(jnp.diff(start) > c).astype(jnp.int32), _mesh_axes(plan)) > 0
    recv = jax.lax.all_to_all(send, plan.axis, 0, 0, tiled=True)
    return Route(inv.reshape(-1), owner, pos, recv, weight, over)


def lookup(plan: EmbeddingPlan, s: Store, block: jax.Array, route: Route, b: int) -> jax.Array:
    """Pooled activations ``f32[b, store fields, Dg]`` of this device's batch (fields in member
    order)."""
    m_, (_, c), d = plan.n_shards, route.recv.shape, block.shape[1]
    rows = jnp.take(block, route.recv.reshape(-1), axis=0, mode="fill", fill_value=0)
    back = jax.lax.all_to_all(rows.reshape(m_, c, d), plan.axis, 0, 0, tiled=True)
    ok = (route.owner < m_) & (route.pos < c)
    uniq_rows = back[jnp.minimum(route.owner, m_ - 1), jnp.minimum(route.pos, c - 1)]
    uniq_rows = uniq_rows * ok[:, None].astype(uniq_rows.dtype)
    per_entry = uniq_rows[route.inv] * route.weight[:, None]
    return per_entry.reshape(b, len(_fields(s)), -1, d).sum(axis=2)


def update(plan: EmbeddingPlan, opt, s: Store, block, slots, route: Route, g: jax.Array, step):
    """Apply this device's activation gradients ``g`` (``f32[b, F, Dg]`` of the group, already
    scaled to the global mean) to the owners' rows; returns this shard's (block, slots)."""
    m_, (_, c), d = plan.n_shards, route.recv.shape, g.shape[-1]
    gf = g[:, list(_fields(s)), :]
    n_len = route.weight.shape[0] // (gf.shape[0] * gf.shape[1])
    per_entry = (gf[:, :, None, :] * route.weight.reshape(gf.shape[:2] + (n_len, 1))).reshape(-1, d)
    per_uniq = jax.ops.segment_sum(per_entry, route.inv, num_segments=per_entry.shape[0])
    ok = (route.owner < m_) & (route.pos < c)
    send = jnp.zeros((m_, c, d), g.dtype).at[jnp.where(ok, route.owner, m_), route.pos].set(
        per_uniq, mode="drop")
    got = jax.lax.all_to_all(send, plan.axis, 0, 0, tiled=True)
    recv = route.recv
    if not plan.same_axis:  # a row block's replicas over data: every data shard's gradients
        # for it (over a data axis of size 1 too: a no-op on the values that makes the block
        # invariant over data, as the masked path's is, so lax.cond's branches agree)
        recv, got = (jax.lax.all_gather(x, plan.batch_axis, axis=0, tiled=True, to="invarying")
                     for x in (recv, got))
    return opt.update(block, slots, recv.reshape(-1), got.reshape(-1, d), step)


def host_over(plan: EmbeddingPlan, ids: np.ndarray, mask: np.ndarray | None, factor: float,
              n_sources: int) -> bool:
    """Whether a step on the global batch ``ids i32[B, F, L]`` takes the masked path: the
    `make_route` capacity test in numpy, for the ``n_sources`` devices that route (contiguous
    slices of the batch). The trainer checks its first batches with it and reports the count."""
    for s in plan.stores:
        if s.kind != "rows":
            continue
        keys = np.concatenate([m.store_rows(ids[:, m.table.field_index, :].astype(np.int64), s.rows)
                               for m in s.members], axis=1)
        if mask is not None:
            held = np.concatenate([mask[:, m.table.field_index, :] for m in s.members], axis=1)
            keys = np.where(held != 0, keys, -1)
        per_source = keys.reshape(n_sources, -1)
        c = capacity(per_source.shape[1], plan.n_shards, factor)
        for row in per_source:
            u = np.unique(row)
            if np.bincount(u[u >= 0] // s.rows, minlength=plan.n_shards).max() > c:
                return True
    return False
