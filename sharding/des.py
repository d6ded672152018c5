"""DES: distributed equivalent substitution of the weights-rich operators (Rong et al., SIGIR 2020).

Fields are partitioned over the N shards of the ``field`` mesh axis (`place_fields`). A shard
holds, *co-located*, the embedding rows of its fields (a fused table-wise store per group) and
the slices of the weights-rich operators that multiply those fields:

* LR first order (Eq. 2-3):     ``sigma(psum(sum_{j in W_i} w_j x_j) + b)``
* FM second order (Eq. 4-6):    ``0.5 <psum(M1), psum(M1)> - 0.5 psum(M2)``,
  ``M1 = sum_{f local} v_f``, ``M2 = sum_{f local} |v_f|^2``
* first FC layer (Eq. 7-9):     ``psum(V_i^T W_i)``: the rows of ``deep.layer_0.kernel`` of the
  local fields (Wide&Deep, DeepFM, DCN's deep tower)
* DCN cross layer:              ``x0 * psum(x_local . w_local) + b + x``, the columns of
  ``cross_w``/``cross_b`` (and the rows of ``out.kernel``) of the local fields.

All partial results of one stage go through a single collective (they are concatenated). When
the batch splits evenly over the N field shards it is a ``psum_scatter`` over the batch: shard k
gets the complete sums of examples ``[k b/N, (k+1) b/N)`` and runs the upper network on those
rows only (data parallel above the substituted layer, as in the paper), and the ``[b]`` logits
are all-gathered at the end. A DeepFM step then moves one reduce-scatter of
``[b, 1 + D + 1 + H1]`` floats and one gather of ``b`` logits forward, their transposes backward,
and nothing else for the split weights. Otherwise it is a ``psum`` and every shard runs the
upper network on the whole batch. The dense
features' rows of these weights and the rest of the network are replicated and synchronised
as in sync mode.

Param trees are the flax trees of `recjax.models` (names unchanged); each split leaf becomes
``{"fields": [N * Fs * D, ...] split on "field", "rest": [n_dense (+ deep), ...] replicated}``
with the field rows in shard-major, zero-padded slot order (`split_params` / `join_params`).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from recjax.embeddings import EmbeddingLayout, TableConfig
from recjax.features import FeatureSpec
from recjax.models.ops import MLP, first_order
from sharding.embedding import EmbeddingPlan, Member, Store

SUBSTITUTIONS = ("lr", "fm", "wide_deep", "deepfm", "dcn")
AXIS = "field"


def check_model(name: str) -> None:
    """Raise a message naming the alternatives when DES has no substitution for `name`."""
    if name not in SUBSTITUTIONS:
        raise ValueError(f"--algo des: no equivalent substitution for model {name!r} (DES splits "
                         f"the weights-rich operators of {', '.join(SUBSTITUTIONS)}); use one of "
                         "those models, or --algo sync for this one")


# ---- field -> shard placement -------------------------------------------------------------


def place_fields(spec: FeatureSpec, n: int, how: str, dims: tuple[int, ...] = (1,)) -> tuple[int, ...]:
    """Shard of every field. Fields sharing a table stay together (co-located rows).

    Args:
      spec: the dataset's fields.
      n: shards on the field axis.
      how: ``round_robin`` (the paper's ``f mod N``, over tables), ``balanced`` (largest table
        first onto the least-loaded shard, load = rows x sum of dims), or an explicit
        comma-separated shard per field, e.g. ``"0,0,1,0"``.
      dims: embedding dims of the groups (for the balanced load).

    Raises:
      ValueError: an unknown method, or an explicit list of the wrong length, out of range, or
        splitting fields of one table.
    """
    tables = list(dict.fromkeys(f.table for f in spec.fields))
    if how == "round_robin":
        shard = {t: i % n for i, t in enumerate(tables)}
        return tuple(shard[f.table] for f in spec.fields)
    if how == "balanced":
        size = {f.table: f.vocab_size * sum(dims) for f in spec.fields}
        load, shard = [0] * n, {}
        for t in sorted(tables, key=lambda t: (-size[t], tables.index(t))):
            shard[t] = int(np.argmin(load))
            load[shard[t]] += size[t]
        return tuple(shard[f.table] for f in spec.fields)
    try:
        out = tuple(int(x) for x in how.split(","))
    except ValueError:
        raise ValueError(f"spmd.des_placement={how!r}: use round_robin, balanced, or one shard "
                         "per field like 0,1,1,0") from None
    if len(out) != spec.n_fields or not all(0 <= s < n for s in out):
        raise ValueError(f"spmd.des_placement={how!r}: needs {spec.n_fields} shard numbers in "
                         f"[0, {n})")
    for t in tables:
        if len({s for s, f in zip(out, spec.fields) if f.table == t}) > 1:
            raise ValueError(f"spmd.des_placement: fields of table {t!r} are on different shards; "
                             "fields sharing a table must be co-located")
    return out


@dataclasses.dataclass(frozen=True)
class DesLayout:
    """Fields in shard-major slots: shard k owns slots ``[k * Fs, (k + 1) * Fs)``.

    Attributes:
      n: N, shards on the field axis.
      fs: Fs, slots per shard (the most fields any shard holds; the rest is zero padding).
      slot_field: field in each of the ``N * Fs`` slots, -1 for padding.
      slot_row: first row of the slot's table in its shard's fused block.
      rows: R, rows of each shard's fused block.
      plan: the fused table-wise stores (one per group) as an `EmbeddingPlan` on ``field``.
      local: the layout of one shard's lookup (`recjax.embeddings.lookup` on Fs fields).
      embed_dim: D.
      n_fields: F.
    """

    n: int
    fs: int
    slot_field: tuple[int, ...]
    slot_row: tuple[int, ...]
    rows: int
    plan: EmbeddingPlan
    local: EmbeddingLayout
    embed_dim: int
    n_fields: int


def make_layout(layout: EmbeddingLayout, spec: FeatureSpec, assign: tuple[int, ...], n: int,
                n_data: int, embed_dim: int) -> DesLayout:
    """Slots, fused stores and local lookup layout for the field placement `assign`."""
    per = [[f for f in range(spec.n_fields) if assign[f] == k] for k in range(n)]
    fs = max(1, max(len(p) for p in per))
    slot_field = [f for p in per for f in p + [-1] * (fs - len(p))]
    offset, fill = {}, [0] * n
    for f in range(spec.n_fields):
        t = spec.fields[f].table
        if t not in offset:
            offset[t] = fill[assign[f]]
            fill[assign[f]] += spec.fields[f].vocab_size
    rows = max(1, max(fill))
    stores, pooling = [], layout.tables[0].pooling
    for group, dim in layout.groups:
        members = tuple(Member(t, assign[t.field_index[0]], t.num_embeddings,
                               offset[t.name.split("/", 1)[1]]) for t in layout.group_tables(group))
        stores.append(Store(f"{group}/@des", "rows", group, rows, dim, members))
    plan = EmbeddingPlan(tuple(stores), AXIS, n, "data", n_data, pooling,
                         {t.name: "table_wise" for t in layout.tables})
    local = EmbeddingLayout(layout.groups, tuple(
        TableConfig(f"{g}/@des", rows, d, (), tuple(range(fs)), pooling) for g, d in layout.groups), fs)
    slot_row = tuple(offset[spec.fields[f].table] if f >= 0 else 0 for f in slot_field)
    return DesLayout(n, fs, tuple(slot_field), slot_row, rows, plan, local, embed_dim,
                     spec.n_fields)


def des_ids(dl: DesLayout, ids: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Host batch ``ids i32[B, F, L]`` -> slot ids (rows of the owning shard's block) and mask."""
    slot = np.asarray(dl.slot_field)
    real = slot >= 0
    src = np.where(real, slot, 0)
    out = ids[:, src, :] + np.asarray(dl.slot_row, ids.dtype)[None, :, None]
    m = np.ones(out.shape, np.float32) if mask is None else mask[:, src, :].astype(np.float32)
    return out, m * real[None, :, None]


# ---- split weights ----------------------------------------------------------------------


def split_leaves(model: str, params) -> dict[tuple[str, ...], int]:
    """Path -> axis of every leaf with a field-major feature axis of length ``F * D + ...``."""
    out = {}
    if model in ("wide_deep", "deepfm"):
        out[("deep", "layer_0", "kernel")] = 0
    if model == "dcn":
        out[("cross_w",)] = out[("cross_b",)] = 1
        out[("out", "kernel")] = 0
        if "deep" in params:
            out[("deep", "layer_0", "kernel")] = 0
    return out


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    tree = dict(tree)
    tree[path[0]] = value if len(path) == 1 else _set(tree[path[0]], path[1:], value)
    return tree


def split_params(dl: DesLayout, model: str, params, xp=np):
    """Flax params -> DES params: each split leaf -> ``{"fields": slot rows, "rest": the others}``.

    `xp`: numpy (host arrays), or jax.numpy (inside a jit over global arrays: a restored
    multi-process checkpoint is split where its shards are, `sharding.spmd`)."""
    slot = np.asarray(dl.slot_field)
    real = slot >= 0
    fd = dl.n_fields * dl.embed_dim
    for path, axis in split_leaves(model, params).items():
        x = xp.moveaxis(xp.asarray(_get(params, path)), axis, 0)
        fields = x[:fd].reshape((dl.n_fields, dl.embed_dim) + x.shape[1:])
        padded = xp.zeros((len(slot),) + fields.shape[1:], x.dtype)
        if xp is np:
            padded[real] = fields[slot[real]]
        else:
            padded = padded.at[np.flatnonzero(real)].set(fields[slot[real]])
        value = {"fields": xp.moveaxis(padded.reshape((-1,) + x.shape[1:]), 0, axis),
                 "rest": xp.moveaxis(x[fd:], 0, axis)}
        params = _set(params, path, value)
    return params


def join_params(dl: DesLayout, model: str, params, xp=np):
    """Inverse of `split_params` (`xp` as there)."""
    slot = np.asarray(dl.slot_field)
    where = {f: i for i, f in enumerate(slot) if f >= 0}
    for path, axis in split_leaves(model, params).items():
        v = _get(params, path)
        fields = xp.moveaxis(xp.asarray(v["fields"]), axis, 0)
        fields = fields.reshape((len(slot), dl.embed_dim) + fields.shape[1:])
        ordered = fields[np.array([where[f] for f in range(dl.n_fields)])].reshape(
            (-1,) + fields.shape[2:])
        rest = xp.moveaxis(xp.asarray(v["rest"]), axis, 0)
        params = _set(params, path, xp.moveaxis(xp.concatenate([ordered, rest]), 0, axis))
    return params


def param_specs(model: str, params):
    """PartitionSpecs of DES params: split ``fields`` on the field axis, the rest replicated."""
    specs = jax.tree.map(lambda _: P(), params)
    for path, axis in split_leaves(model, params).items():
        specs = _set(specs, path, {"fields": P(*([None] * axis), AXIS), "rest": P()})
    return specs


def map_param_like(fn, tree, treedef, other=lambda x: x):
    """Apply `fn` to every subtree of `tree` (an optax state) shaped like the params, and
    `other` to the remaining leaves (step counts)."""
    if jax.tree.structure(tree) == treedef:
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_param_like(fn, x, treedef, other) for x in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_param_like(fn, x, treedef, other) for x in tree)
    if isinstance(tree, dict):
        return {k: map_param_like(fn, v, treedef, other) for k, v in tree.items()}
    return tree if tree is None else other(tree)


# ---- the substituted forward passes (inside shard_map over "field") -------------------------


class _Rows:
    """Where a stage's summed partial results go: every shard (``psum``), or, when the batch
    splits evenly over the field axis, each shard its own slice of the examples (``psum_scatter``:
    half an all-reduce's bytes, and the layers above run on ``b / N`` rows instead of all ``b``
    on every shard, the paper's data-parallel upper network). The logits are all-gathered at the
    end, so the caller sees the full batch either way."""

    def __init__(self, b: int):
        n = jax.lax.axis_size(AXIS)
        self.split = n > 1 and b % n == 0
        self.size = b // n if self.split else b

    def sum(self, parts: list[jax.Array]) -> list[jax.Array]:
        """One collective for all partial results ``[b, w_i]`` of a stage."""
        x = jnp.concatenate(parts, axis=1)
        total = (jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True) if self.split
                 else jax.lax.psum(x, AXIS))
        return jnp.split(total, np.cumsum([p.shape[1] for p in parts])[:-1], axis=1)

    def mine(self, x: jax.Array) -> jax.Array:
        """This shard's rows of a field-replicated ``[b, ...]`` array (dense features)."""
        if not self.split:
            return x
        return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(AXIS) * self.size, self.size)

    def full(self, logits: jax.Array) -> jax.Array:
        if not self.split:
            return logits
        return jax.lax.all_gather(logits, AXIS, axis=0, tiled=True, to="invarying")


def _dense_linear(params, dense):
    return dense @ params["dense_w"] if "dense_w" in params else 0.0


def _fm_partials(emb):
    """M1 = sum_f v_f [b, D] and M2 = sum_f |v_f|^2 [b, 1] over the local fields (Eq. 4-5)."""
    return [jnp.sum(emb, axis=1), jnp.sum(jnp.square(emb), axis=(1, 2))[:, None]]


def _fm_join(m1, m2):
    """Eq. 6: 0.5 <psum(M1), psum(M1)> - 0.5 psum(M2)."""
    return 0.5 * jnp.sum(jnp.square(m1), axis=-1) - 0.5 * m2[:, 0]


def _mlp_after_first(p, n_layers: int, last_linear: bool, h):
    """Layers 1..n-1 of an `MLP` whose layer 0 pre-activation is `h` (same flax params)."""
    if n_layers > 1 or not last_linear:
        h = nn.relu(h)
    if n_layers == 1:
        return h
    sub = {f"layer_{i - 1}": p[f"layer_{i}"] for i in range(1, n_layers)}
    widths = tuple(p[f"layer_{i}"]["bias"].shape[0] for i in range(1, n_layers))
    return MLP(widths, last_linear).apply({"params": sub}, h)


@dataclasses.dataclass(frozen=True)
class DesForward:
    """``logits(params, acts, dense)`` of a model on one field shard: duck-types `step.Model`.

    ``acts`` are this shard's slots (``[b, Fs, Dg]``); the result is the full model's logits,
    equal on every shard of the field axis.

    Attributes:
      model: model name (one of `SUBSTITUTIONS`).
      microbatches: as `recjax.train.step.Model.microbatches`.
    """

    model: str
    microbatches: int = 0

    def logits(self, params, acts: dict, dense: jax.Array) -> jax.Array:
        b = dense.shape[0]
        rows = _Rows(b)
        if self.model == "dcn":
            return rows.full(self._dcn(params, acts["emb"].reshape(b, -1), dense, rows))
        parts = [first_order(acts["wide"])[:, None]]  # Eq. 2-3
        if self.model in ("fm", "deepfm"):
            parts += _fm_partials(acts["emb"])
        if self.model in ("wide_deep", "deepfm"):  # Eq. 7-9: V_i^T W_i
            parts.append(acts["emb"].reshape(b, -1) @ params["deep"]["layer_0"]["kernel"]["fields"])
        summed = rows.sum(parts)
        dense = rows.mine(dense)
        logit = summed[0][:, 0] + _dense_linear(params, dense)
        if self.model in ("lr", "fm"):
            logit = logit + params["bias"]
        if self.model in ("fm", "deepfm"):
            logit = logit + _fm_join(summed[1], summed[2])
        if self.model in ("wide_deep", "deepfm"):
            deep = params["deep"]
            l0 = deep["layer_0"]
            h = summed[-1] + dense @ l0["kernel"]["rest"] + l0["bias"]
            logit = logit + _mlp_after_first(deep, len(deep), True, h)[:, 0]
        return rows.full(logit)

    def _dcn(self, params, x0_f, x0_d, rows: _Rows):
        """Cross layers on (local field columns, replicated dense columns) for the whole batch
        (a ``[b]`` psum per layer), then out + deep on this shard's rows."""
        w, bias = params["cross_w"], params["cross_b"]
        x_f, x_d = x0_f, x0_d
        for layer in range(w["fields"].shape[0]):
            s = (jax.lax.psum(x_f @ w["fields"][layer], AXIS)  # x_l . w_l over all features
                 + x_d @ w["rest"][layer])
            x_f = x0_f * s[:, None] + bias["fields"][layer] + x_f
            x_d = x0_d * s[:, None] + bias["rest"][layer] + x_d
        out = params["out"]
        parts = [x_f @ out["kernel"]["fields"]]
        if "deep" in params:
            parts.append(x0_f @ params["deep"]["layer_0"]["kernel"]["fields"])
        summed = rows.sum(parts)
        n_d = x0_d.shape[1]
        x_d, x0_d = rows.mine(x_d), rows.mine(x0_d)
        logit = summed[0] + x_d @ out["kernel"]["rest"][:n_d] + out["bias"]
        if "deep" in params:
            deep, l0 = params["deep"], params["deep"]["layer_0"]
            h = _mlp_after_first(deep, len(deep), False,
                                 summed[1] + x0_d @ l0["kernel"]["rest"] + l0["bias"])
            logit = logit + h @ out["kernel"]["rest"][n_d:]
        return logit[:, 0]
