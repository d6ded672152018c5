"""Communication accounting: bytes each collective of a jitted step moves, and DES's baseline.

`collectives` walks the step's jaxpr (including the collectives autodiff inserts, e.g. the
gradient all-reduce that is the transpose of ``pvary``) and sizes each from the local shapes it
exchanges inside `shard_map`. Bytes are what a device *sends* with the usual bandwidth-optimal
algorithms on a group of n devices, times the devices in the mesh:

    all-reduce      2 (n-1)/n * S        (ring: reduce-scatter + all-gather)
    all-gather      (n-1) * S_in         (every device receives the n-1 other blocks)
    reduce-scatter  (n-1)/n * S_in
    all-to-all      (n-1)/n * S_in

Of a ``lax.cond`` only the lighter branch is counted: one branch runs, and in sync's routed step
the heavier one is the exact fallback taken only over capacity (summary.json counts those on
the first batches as ``route_over_capacity``).

`mesh_lookup_bytes` is the communication DES replaces (Rong et al., SIGIR 2020, Sec. 4.1-4.3):
a data-parallel worker holding B/N examples pulls the rows of its unique ids from the embedding
shards (ids + rows) and pushes their gradients back, for the fraction (N-1)/N of rows that live
elsewhere: ``Q_mesh = sum_w (N-1)/N * U_w * (K + P * 4 * D)`` per table group, K = 4 (our int32
ids) and P = 2 (pull rows, push gradients). DES instead all-reduces its partial results of
width W per example over the N field shards: ``Q_DES = 2 (N-1) * B * W * 4``.
``R = 1 - Q_DES / Q_mesh``.

The paper counts less on the mesh side: uint64 keys and the pull only (K = 8, P = 1:
``Q^Mesh = (N-1)/N (S_f + S_w)``, Sec. 4.1), and it compares one worker's batch of B under
both strategies; with ``unique = [U] * N`` and ``key_bytes=8, directions=1`` these functions
give its ``R_lr`` and ``R_fm(2)``, which reproduce its Table 2 (tests/test_des_table2.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import jax
import numpy as np

# primitive name -> collective kind (jax 0.10 names; psum inside shard_map is psum_invariant)
KINDS = {"psum": "all_reduce", "psum_invariant": "all_reduce", "psum2": "all_reduce",
         "all_gather": "all_gather", "all_gather_invariant": "all_gather",
         "reduce_scatter": "reduce_scatter", "psum_scatter": "reduce_scatter",
         "all_to_all": "all_to_all", "ppermute": "permute"}


def _sub_jaxprs(params: dict) -> Iterable:
    for v in params.values():
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if hasattr(x, "eqns"):
                yield x
            elif hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                yield x.jaxpr


def _axes(params: dict) -> tuple:
    a = params.get("axes", params.get("axis_name", ()))
    return tuple(a) if isinstance(a, (tuple, list)) else (a,)


def _walk(jaxpr, sizes: dict, out: list) -> None:
    for e in jaxpr.eqns:
        if e.primitive.name == "cond":  # one branch runs: count the lighter one (sync's routed
            branches = []               # path; its exact fallback runs only over capacity)
            for b in e.params["branches"]:
                branches.append([])
                _walk(b.jaxpr, sizes, branches[-1])
            out.extend(min(branches, key=lambda r: sum(c["bytes_per_device"] for c in r)))
            continue
        kind = KINDS.get(e.primitive.name)
        if kind:
            axes = tuple(a for a in _axes(e.params) if a in sizes)
            n = math.prod(sizes[a] for a in axes)
            nbytes = sum(int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize for v in e.invars)
            factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": n - 1,
                      "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n,
                      "permute": 1.0 if n > 1 else 0.0}[kind]
            out.append({"op": kind, "axes": list(axes), "group": n,
                        "shape": [list(v.aval.shape) for v in e.invars],
                        "dtype": str(e.invars[0].aval.dtype),
                        "bytes_per_device": factor * nbytes})
        for sub in _sub_jaxprs(e.params):
            _walk(sub, sizes, out)


def collectives(fn: Callable, mesh, *args) -> list[dict]:
    """Every collective one call of ``fn(*args)`` runs on `mesh`, with its bytes sent per device."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    out: list[dict] = []
    _walk(jaxpr.jaxpr, dict(mesh.shape), out)
    for c in out:
        c["bytes"] = c["bytes_per_device"] * mesh.size
    return out


def summarize(records: list[dict]) -> dict:
    """summary.json fields: total bytes per step (all devices) and the per-collective list."""
    return {"comm_bytes_per_step": float(sum(r["bytes"] for r in records)),
            "comm_collectives": [{k: r[k] for k in ("op", "axes", "group", "shape", "dtype", "bytes")}
                                 for r in records if r["bytes"] > 0]}


# ---- DES vs the mesh/PS lookup (paper Sec. 4) ------------------------------------------------

ID_BYTES, F32 = 4, 4


def unique_per_worker(ids: np.ndarray, n_workers: int, table_of_field: list[str],
                      mask: np.ndarray | None = None) -> list[int]:
    """U_w: distinct (table, id) pairs in each worker's B/N slice of ``ids i32[B, F, L]``."""
    out = []
    for part_ids, part_mask in zip(np.array_split(ids, n_workers),
                                   np.array_split(mask, n_workers) if mask is not None
                                   else [None] * n_workers):
        total = 0
        for table in dict.fromkeys(table_of_field):
            cols = [f for f, t in enumerate(table_of_field) if t == table]
            x = part_ids[:, cols, :]
            if part_mask is not None:
                x = x[part_mask[:, cols, :] > 0]
            total += len(np.unique(x))
        out.append(total)
    return out


def mesh_lookup_bytes(unique: list[int], n_shards: int, dims: Iterable[int], *,
                      key_bytes: int = ID_BYTES, directions: int = 2) -> float:
    """Q_mesh: ids + pulled rows (+ pushed row gradients) of every worker, for groups of `dims`.

    Args:
      unique: U_w, distinct ids of each worker's examples.
      key_bytes: K, bytes per id sent (ours int32: 4; the paper's uint64 keys: 8).
      directions: P, row transfers per id: 2 = pull rows and push their gradients (ours),
        1 = pull only (the paper's Sec. 4 accounting).
    """
    remote = (n_shards - 1) / n_shards
    return float(sum(remote * u * (key_bytes + directions * F32 * d) for u in unique for d in dims))


def des_bytes(batch: int, n_shards: int, width: int) -> float:
    """Q_DES: all-reduce of ``width`` partial-result floats per example over the field shards."""
    return 2.0 * (n_shards - 1) * batch * width * F32


# Partial-result width W per example and the embedding groups whose lookup it replaces.
def des_widths(model: str, embed_dim: int, first_hidden: int) -> tuple[int, tuple[int, ...]]:
    """(W, dims of the replaced lookups) of each substitution: LR Eq. 2-3, FM Eq. 4-6, DNN 7-9."""
    return {"lr": (1, (1,)), "fm": (embed_dim + 1, (embed_dim,)),
            "dnn": (first_hidden, (embed_dim,))}[model]


def saving_ratio(model: str, batch: int, unique: list[int], n_shards: int, embed_dim: int,
                 first_hidden: int, *, key_bytes: int = ID_BYTES, directions: int = 2) -> float:
    """R = 1 - Q_DES / Q_mesh for one operator at global batch ``batch`` on ``n_shards``
    (`mesh_lookup_bytes` for ``key_bytes`` and ``directions``)."""
    width, dims = des_widths(model, embed_dim, first_hidden)
    mesh = mesh_lookup_bytes(unique, n_shards, dims, key_bytes=key_bytes, directions=directions)
    return 1.0 - des_bytes(batch, n_shards, width) / mesh
