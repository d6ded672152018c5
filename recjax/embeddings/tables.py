"""Embedding tables, pooled lookup, and the sparse side of the sparse/dense boundary.

DESIGN.md section 1: the model sees only the looked-up activations ``acts[group]: f32[B, F, Dg]``.
`jax.value_and_grad` w.r.t. those activations gives ``g_acts``; `row_gradients` turns ``g_acts``
into (row ids, row gradients) per table, and a sparse optimizer (`sparse_optim.py`) applies them
to the touched rows only. Nothing here ever forms a dense, table-sized gradient
(PERF_NOTES pitfall 1).

Groups: a model consumes one or more *groups* of activations, each with its own dim: ``"emb"``
(dim D, the embeddings) and ``"wide"`` (dim 1, first-order weights as tables of dim 1). Each
group has one table per distinct ``FieldSpec.table``, named ``"{group}/{table}"``; several fields
may share a table (torchrec's ``EmbeddingBagConfig.feature_names``).
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from recjax.data.hashing import mix64
from recjax.features import POOLINGS, FeatureSpec


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table (torchrec's ``EmbeddingBagConfig``).

    Attributes:
      name: ``"{group}/{table}"``, the key of the table in the tables dict.
      num_embeddings: rows (V).
      embedding_dim: columns (Dg).
      feature_names: the fields that look this table up, in batch order.
      field_index: positions of those fields on the F axis of ``ids``.
      pooling: ``"sum"`` or ``"mean"`` over the L ids of a multi-hot field.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    field_index: tuple[int, ...]
    pooling: str = "sum"


@dataclasses.dataclass(frozen=True)
class EmbeddingLayout:
    """Which tables each activation group reads, built from a `FeatureSpec` by `make_layout`.

    Attributes:
      groups: group name -> its dim, in a fixed order.
      tables: every table of every group, in a fixed order.
      n_fields: F.
    """

    groups: tuple[tuple[str, int], ...]
    tables: tuple[TableConfig, ...]
    n_fields: int

    def group_tables(self, group: str) -> tuple[TableConfig, ...]:
        return tuple(t for t in self.tables if t.name.split("/", 1)[0] == group)

    @property
    def num_rows(self) -> int:
        return sum(t.num_embeddings for t in self.tables)


def make_layout(spec: FeatureSpec, groups: dict[str, int], pooling: str = "sum",
                dims: dict[str, int] | None = None) -> EmbeddingLayout:
    """One table per (group, distinct table of the spec), fields sharing tables as the spec says.

    `pooling` is the default; a field's own ``FieldSpec.pooling`` overrides it. `dims` gives
    the ``"emb"`` group's tables their own widths (spec table name -> dim <= the group's dim,
    ``embed.dims``); `lookup` zero-pads a narrower table's activations to the group's dim and
    `row_gradients` drops the padding's gradient.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be 'sum' or 'mean', got {pooling!r}")
    if spec.n_fields == 0:
        raise ValueError("the data has no categorical fields; recjax models need at least one")
    tables = []
    for group, dim in groups.items():
        by_table: dict[str, list[int]] = {}
        for i, f in enumerate(spec.fields):
            by_table.setdefault(f.table, []).append(i)
        for table, idx in by_table.items():
            pools = {spec.fields[i].pooling or pooling for i in idx}
            if len(pools) > 1:
                raise ValueError(f"fields sharing table {table!r} ask for different poolings "
                                 f"{sorted(pools)}; give them one")
            tables.append(TableConfig(
                name=f"{group}/{table}",
                num_embeddings=spec.fields[idx[0]].vocab_size,
                embedding_dim=(dims or {}).get(table, dim) if group == "emb" else dim,
                feature_names=tuple(spec.fields[i].name for i in idx),
                field_index=tuple(idx),
                pooling=pools.pop(),
            ))
    return EmbeddingLayout(tuple(groups.items()), tuple(tables), spec.n_fields)


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def init_rows(seed: int, table: str, ids: np.ndarray, dim: int, num_embeddings: int,
              scale: str | float = "dlrm") -> np.ndarray:
    """Initial rows drawn from (seed, table name, id) alone: f32[len(ids), dim].

    The same id always gets the same row, whatever else the table holds, so a dynamic-id store
    (`recjax.embeddings.dynamic`) can evict a row and later re-admit it from the same values,
    and a fixed table built with ``embed.init_by_id`` starts where such a store starts.
    Distributions as `init_tables` (``num_embeddings`` sets the dlrm bound); the bits of entry
    (id, j) are splitmix64 of a counter, so rows are independent across ids and columns.

    Args:
      ids: i64[n] row ids (any 64-bit values; raw feature ids included).
    """
    ids = np.asarray(ids).astype(np.uint64).reshape(-1)
    if dim == 1:  # wide tables start at 0
        return np.zeros((ids.size, 1), np.float32)
    key = mix64(np.uint64(_name_key(table)) ^ mix64(np.uint64(seed & (2**64 - 1))))
    with np.errstate(over="ignore"):
        base = mix64(ids ^ key)[:, None] * np.uint64(2 * dim)
        col = np.arange(2 * dim, dtype=np.uint64)[None, :]
        bits = mix64(base + col)
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    if scale == "dlrm":
        bound = 1.0 / np.sqrt(num_embeddings)
        return ((2.0 * u[:, :dim] - 1.0) * bound).astype(np.float32)
    # Box-Muller on the two halves of the columns
    z = np.sqrt(-2.0 * np.log(u[:, :dim])) * np.cos(2.0 * np.pi * u[:, dim:])
    return (float(scale) * z).astype(np.float32)


def init_tables(layout: EmbeddingLayout, seed: int, scale: str | float = "dlrm",
                by_id: bool = False) -> dict[str, np.ndarray]:
    """Initial tables as host numpy arrays (device placement is the caller's business).

    ``scale="dlrm"`` draws U(-1/sqrt(V), 1/sqrt(V)) per table as the DLRM reference does; a float
    draws N(0, scale^2). Wide (dim 1) tables start at 0, like a logistic regression.
    Each table gets its own generator seeded from (seed, table name), so adding a table does not
    change the others' initial values. With `by_id` every row is `init_rows` of its id instead.
    """
    out = {}
    for t in layout.tables:
        if by_id:
            out[t.name] = init_rows(seed, t.name, np.arange(t.num_embeddings), t.embedding_dim,
                                    t.num_embeddings, scale)
            continue
        name_key = _name_key(t.name)
        rng = np.random.default_rng([seed, name_key])
        shape = (t.num_embeddings, t.embedding_dim)
        if t.embedding_dim == 1:
            out[t.name] = np.zeros(shape, np.float32)
        elif scale == "dlrm":
            bound = 1.0 / np.sqrt(t.num_embeddings)
            out[t.name] = rng.uniform(-bound, bound, shape).astype(np.float32)
        else:
            out[t.name] = (float(scale) * rng.standard_normal(shape)).astype(np.float32)
    return out


def _pool_weights(t: TableConfig, mask: jax.Array | None, idx: tuple[int, ...]) -> jax.Array | None:
    """Per-id pooling weights w[B, |idx|, L] (mask, divided by the count for mean); None = 1."""
    if mask is None:
        return None
    w = mask[:, idx, :]
    if t.pooling == "mean":
        w = w / jnp.maximum(w.sum(-1, keepdims=True), 1.0)
    return w


def lookup(layout: EmbeddingLayout, tables: dict, ids: jax.Array, mask: jax.Array | None) -> dict:
    """Pooled activations per group: ``acts[group]: f32[B, F, Dg]`` in field order.

    Args:
      layout: from `make_layout`.
      tables: ``name -> f32[V, Dg]``.
      ids: i32[B, F, L] ids, in range for their field's table.
      mask: f32[B, F, L] or None (every field one-hot, L = 1).
    """
    acts = {}
    for group, dim in layout.groups:
        parts, order = [], []
        for t in layout.group_tables(group):
            idx = t.field_index
            rows = jnp.take(tables[t.name], ids[:, idx, :], axis=0, mode="clip")  # [B, f, L, D]
            w = _pool_weights(t, mask, idx)
            if w is None:
                pooled = rows.sum(axis=2) if rows.shape[2] > 1 else rows[:, :, 0]
            else:
                pooled = jnp.einsum("bfld,bfl->bfd", rows, w)
            if t.embedding_dim < dim:  # a narrower table (embed.dims): zero-pad to the group's dim
                pooled = jnp.pad(pooled, ((0, 0), (0, 0), (0, dim - t.embedding_dim)))
            parts.append(pooled)
            order.extend(idx)
        stacked = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
        if order != sorted(order):  # fields of shared tables are not contiguous: restore order
            stacked = stacked[:, np.argsort(order), :]
        acts[group] = stacked
    return acts


def row_gradients(layout: EmbeddingLayout, g_acts: dict, ids: jax.Array, mask: jax.Array | None,
                  ) -> dict[str, tuple[jax.Array, jax.Array]]:
    """Per table, the touched rows and their gradients: ``name -> (i32[N], f32[N, Dg])``.

    Row r's total gradient is the sum of the returned gradients of every entry with id r
    (duplicates are *not* merged here; optimizers that need per-row sums merge them exactly).
    Padding positions (mask 0) get id ``V`` (out of range), so scatters with ``mode="drop"``
    skip them and they never touch a real row (e.g. never advance Adam's moments of row 0).
    """
    out = {}
    for t in layout.tables:
        idx = t.field_index
        g = g_acts[t.name.split("/", 1)[0]][:, idx, :t.embedding_dim]  # [B, f, D_t]
        t_ids = ids[:, idx, :]  # [B, f, L]
        w = _pool_weights(t, mask, idx)
        if w is None:
            g_rows = jnp.broadcast_to(g[:, :, None, :], t_ids.shape + g.shape[-1:])
        else:
            g_rows = g[:, :, None, :] * w[..., None]
            t_ids = jnp.where(mask[:, idx, :] > 0, t_ids, t.num_embeddings)
        out[t.name] = (t_ids.reshape(-1), g_rows.reshape(-1, g.shape[-1]))
    return out
