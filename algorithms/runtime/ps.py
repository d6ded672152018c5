"""Parameter servers of the host-async engine: sharded embedding PS, sync PS, dense PS.

Every PS speaks in values (DESIGN.md section 4.2): ``pull``, ``push``, ``snapshot`` and
``restore`` take and return numpy arrays / pytrees of (immutable) jax arrays and never mutate a
caller's object, so a PS can live in another thread, process or host. A batch reaches them
localized (``localize.py``: its ids remapped to the rows it touches, `Rows`).

* `EmbeddingPS`: one copy of every embedding table, placed table-wise on S `EmbeddingShard`\\ s
  (host numpy arrays, optimizer slots beside the rows). Workers `pull` the rows a batch touches
  and `push` row gradients; the shard applies the run's sparse optimizer
  (`recjax.embeddings.SparseOptimizer`, jitted, one call per shard) to the *current* rows and
  writes them back, without locks (Hogwild: a concurrent push to the same row between the
  gather and the write can be lost). Only touched rows move (PERF_NOTES 6).
* Placement (ShadowSync Sec. 3.1): ``mod`` puts table t on shard ``t mod S``; ``binpack``
  profiles each table's lookup cost on a short warm-up (unique rows per batch x dim x 4 bytes,
  pulled and pushed: the bytes its shard serves) and packs tables greedily, largest first, on
  the least-loaded shard (LPT).
* `SyncPS`: the S-EASGD / FR-EASGD central copy ``wPS`` (one fused jitted exchange per sync).
* `DensePS`: the async (Downpour) baseline's dense params, applying each pushed gradient at
  once with the run's optax optimizer, counting staleness.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from algorithms.runtime import batched
from algorithms.runtime.localize import Rows, localize
from recjax.batch import Batch
from recjax.embeddings import EmbeddingLayout, SparseOptimizer
from recjax.embeddings.dynamic import FILLER, LruStore


def profile_costs(layout: EmbeddingLayout, batches: Iterable[Batch]) -> dict[str, float]:
    """Mean bytes a table's shard serves per batch: unique rows x dim x 4 bytes x (pull + push)."""
    tot = collections.Counter()
    n = 0
    for batch in batches:
        _, rows = localize(layout, batch)
        for t in layout.tables:
            tot[t.name] += rows[t.name][1] * t.embedding_dim * 4 * 2
        n += 1
    return {t.name: tot[t.name] / max(n, 1) for t in layout.tables}


def place(costs: dict[str, float], shards: int, how: str) -> dict[str, int]:
    """Table -> shard: ``mod`` (table order mod S) or ``binpack`` (LPT on the profiled costs)."""
    names = list(costs)
    if how == "mod":
        return {name: i % shards for i, name in enumerate(names)}
    if how != "binpack":
        raise ValueError(f"runtime.placement {how!r} is unknown; use mod or binpack")
    load = [0.0] * shards
    out = {}
    for name in sorted(names, key=lambda n: (-costs[n], names.index(n))):
        s = min(range(shards), key=lambda k: (load[k], k))
        out[name] = s
        load[s] += costs[name]
    return out


def shard_loads(costs: dict[str, float], placement: dict[str, int], shards: int) -> list[float]:
    load = [0.0] * shards
    for name, s in placement.items():
        load[s] += costs[name]
    return load


def pad_rows(v: np.ndarray, rows: tuple[np.ndarray, int]) -> np.ndarray:
    """The first n rows of `v` (one table's rows ``(ids, n)``) as ``f32[M, ...]``, zero past n."""
    ids, n = rows
    out = np.zeros((ids.size, *v.shape[1:]), np.asarray(v).dtype)
    out[:n] = np.asarray(v)[:n]
    return out


def row_push(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row summed gradients ``f32[M, D]`` as a push takes them: ``(local ids 0..M-1,
    sums)``. The sparse optimizer's coalesce of distinct ids adds nothing, so the update is the
    one from the entries they sum."""
    return np.arange(len(sums), dtype=np.int32), sums


def _take(a: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return a.take(ids, axis=0, mode="clip")


class EmbeddingShard:
    """One embedding PS: some tables and their sparse-optimizer slots, as host numpy arrays.

    Args:
      index: shard number.
      tables: ``name -> f32[V, D]`` (owned by the shard from now on).
      slots: ``name -> slots pytree`` (arrays with leading dim V, or ``()``).
      opt: the run's sparse optimizer.
    """

    def __init__(self, index: int, tables: dict[str, np.ndarray], slots: dict[str, Any],
                 opt: SparseOptimizer):
        self.index = index
        self.tables = {k: np.array(v, np.float32) for k, v in tables.items()}
        self.slots = {k: jax.tree.map(np.array, v) for k, v in slots.items()}
        self.step = 0

        def apply(tabs, slots, grads, step):
            out = {k: opt.update(tabs[k], slots[k], *grads[k], step) for k in tabs}
            return {k: v[0] for k, v in out.items()}, {k: v[1] for k, v in out.items()}

        self._apply = jax.jit(apply)

    def pull(self, rows: Rows) -> dict[str, np.ndarray]:
        """The mini tables ``name -> f32[n, D]`` (rows past the real ids are filler)."""
        return {k: _take(self.tables[k], rows[k][0]) for k in self.tables}

    def push(self, rows: Rows, grads: dict[str, tuple[Any, Any]]) -> None:
        """Apply ``grads[name] = (local ids, row grads)`` to the current rows (Hogwild)."""
        tabs = self.pull(rows)
        slots = {k: jax.tree.map(lambda a, k=k: _take(a, rows[k][0]), self.slots[k])
                 for k in self.tables}
        new_t, new_s = self._apply(tabs, slots, {k: grads[k] for k in self.tables},
                                   np.int32(self.step))
        self.step += 1
        for k in self.tables:
            ids, n = rows[k]
            ids = ids[:n]
            self.tables[k][ids] = np.asarray(new_t[k])[:n]
            jax.tree.map(lambda dst, src, ids=ids, n=n: dst.__setitem__(ids, np.asarray(src)[:n]),
                         self.slots[k], new_s[k])

    def snapshot(self) -> tuple[dict, dict, int]:
        """Copies of ``(tables, slots, optimizer step)`` (fuzzy while workers push)."""
        return ({k: v.copy() for k, v in self.tables.items()},
                {k: jax.tree.map(np.copy, v) for k, v in self.slots.items()}, self.step)

    def restore(self, snap: tuple[dict, dict, int]) -> None:
        """Replace the rows, slots and optimizer step with copies of a `snapshot`."""
        tables, slots, step = snap
        self.tables = {k: np.array(v, np.float32) for k, v in tables.items()}
        self.slots = {k: jax.tree.map(np.array, v) for k, v in slots.items()}
        self.step = step

    def wipe(self) -> None:
        """Lose every row (fault injection: the shard's process died); NaN until restored."""
        for v in self.tables.values():
            v.fill(np.nan)

    def warm(self, rows: Rows, grads: dict) -> None:
        """Compile the jitted update without changing anything."""
        tabs = self.pull(rows)
        slots = {k: jax.tree.map(lambda a, k=k: _take(a, rows[k][0]), self.slots[k])
                 for k in self.tables}
        jax.block_until_ready(self._apply(tabs, slots, {k: grads[k] for k in self.tables},
                                          np.int32(0)))


class LruShard:
    """An embedding PS shard of dynamic-id tables (``embed.store=lru``): `EmbeddingShard`'s
    interface over one `recjax.embeddings.dynamic.LruStore` per table.

    Rows arrive as raw 64-bit ids (`localize` of a raw-id batch); a push's per-entry row
    gradients are summed per unique id (one jitted scatter-add) before the store applies the
    sparse optimizer to the rows still resident. Evicted or never-admitted ids lose their
    gradient (counted by the store).

    Args:
      index: shard number.
      stores: ``name -> LruStore`` (owned by the shard).
    """

    def __init__(self, index: int, stores: dict[str, LruStore]):
        self.index, self.stores, self.step = index, stores, 0
        # a store's map and recency list are not thread-safe: one request at a time per shard,
        # as Persia locks a shard per get/put (Sec. 4.2.2); Hogwild stays across shards
        self._lock = threading.Lock()
        self._sum = jax.jit(lambda local, g, n: jax.numpy.zeros((n, g.shape[1]), g.dtype)
                            .at[local].add(g, mode="drop"), static_argnums=2)

    @property
    def tables(self) -> dict[str, LruStore]:
        return self.stores

    @staticmethod
    def _ids(entry: tuple[np.ndarray, int]) -> np.ndarray:
        ids, n = entry
        out = np.asarray(ids, np.int64).copy()
        out[n:] = FILLER
        return out

    def pull(self, rows: Rows, admit: bool = True) -> dict[str, np.ndarray]:
        ids = {k: self._ids(rows[k]) for k in self.stores}
        with self._lock:
            return {k: st.pull(ids[k], admit) for k, st in self.stores.items()}

    def push(self, rows: Rows, grads: dict[str, tuple[Any, Any]]) -> None:
        sums = {}
        for k in self.stores:
            local, g = grads[k]
            ids = self._ids(rows[k])
            sums[k] = (ids, np.asarray(self._sum(local, g, ids.size)))
        with self._lock:
            for k, st in self.stores.items():
                st.push(*sums[k], self.step)
            self.step += 1

    def warm(self, rows: Rows, grads: dict) -> None:
        """Compile everything a push or pull can call, before any thread starts: the sum, and
        the stores' jitted slot init and update at every power-of-two row count up to the
        mini table's size (a batch's unique ids vary, so any of them can come up)."""
        for k, st in self.stores.items():
            ids = self._ids(rows[k])
            local, g = grads[k]
            jax.block_until_ready(self._sum(local, g, ids.size))
            b = 1
            while True:
                probe = LruStore(k, st.dim, b, st.opt, seed=st.seed, init=st.init)
                new = np.arange(b, dtype=np.int64)
                probe.pull(new)
                probe.push(new, np.zeros((b, st.dim), np.float32), 0)
                if b >= ids.size:
                    break
                b *= 2

    def snapshot(self) -> tuple[dict, dict, int]:
        with self._lock:
            return {k: st.snapshot() for k, st in self.stores.items()}, {}, self.step

    def restore(self, snap: tuple[dict, dict, int]) -> None:
        snaps, _, step = snap
        with self._lock:
            for k, st in self.stores.items():
                st.restore(snaps[k])
            self.step = step

    def wipe(self) -> None:
        for st in self.stores.values():
            st.values.fill(np.nan)

    def counters(self) -> dict[str, dict[str, int]]:
        return {k: dict(st.counters, resident=st.size) for k, st in self.stores.items()}


def lru_state(snap: dict) -> tuple[np.ndarray, dict]:
    """A store's snapshot as ``(table, slots)`` entries of a `TrainState`: the rows are the
    table (``f32[capacity, D]``), the rest (keys, recency, optimizer slots) rides in slots."""
    return snap["values"], {k: v for k, v in snap.items() if k != "values"}


def lru_snapshot(table: Any, slots: dict) -> dict:
    return {"values": np.asarray(table), **slots}


class EmbeddingPS:
    """S embedding shards with a table -> shard placement.

    Args:
      layout: the embedding layout (table dims).
      tables, slots: initial tables and slots of every table (fixed store); ignored with
        `lru`.
      opt: sparse optimizer applied by the shards.
      placement: table name -> shard index.
      shards: S.
      lru: ``None`` (fixed tables) or the LruStore keywords ``capacity``, ``seed``, ``init``,
        ``admit_probability``: every table is a dynamic-id store (`LruShard`).
    """

    def __init__(self, layout: EmbeddingLayout, tables: dict, slots: dict, opt: SparseOptimizer,
                 placement: dict[str, int], shards: int, lru: dict | None = None):
        self.layout, self.placement, self.num_shards = layout, placement, shards
        self.lru = lru is not None
        if self.lru:
            self.shards = [LruShard(s, {t.name: LruStore(t.name, t.embedding_dim, opt=opt, **lru)
                                        for t in layout.tables if placement[t.name] == s})
                           for s in range(shards)]
        else:
            self.shards = [EmbeddingShard(s, {k: np.asarray(v) for k, v in tables.items()
                                              if placement[k] == s},
                                          {k: v for k, v in slots.items() if placement[k] == s},
                                          opt)
                           for s in range(shards)]
        self._dim = {t.name: t.embedding_dim for t in layout.tables}

    def pull(self, rows: Rows, admit: bool = True) -> dict[str, np.ndarray]:
        """The mini tables of `rows`; ``admit=False`` (eval) changes nothing in an LRU store."""
        out = {}
        for shard in self.shards:
            out.update(shard.pull(rows, admit) if self.lru else shard.pull(rows))
        return out

    def lru_counters(self) -> dict:
        """Per table and summed: admitted, evicted, not_admitted, dropped_gradients, resident."""
        per = {}
        for shard in self.shards:
            per.update(shard.counters())
        total = collections.Counter()
        for c in per.values():
            total.update(c)
        return {"total": dict(total), "per_table": per}

    def push(self, rows: Rows, grads: dict) -> None:
        for shard in self.shards:
            if shard.tables:
                shard.push(rows, grads)

    def push_sums(self, rows: Rows, sums: dict) -> None:
        """Push one summed gradient per row: ``sums[name][i]`` is row i's of the mini table
        `rows[name]`, given for its n real rows at least (rows past n count as zero). The
        same update as a `push` of the entries those sums add up (to rounding under SGD,
        which scales each entry before adding); under Ray only the n real rows travel."""
        self.push(rows, {k: row_push(pad_rows(sums[k], rows[k])) for k in rows})

    def warm(self, rows: Rows, grads: dict) -> None:
        for shard in self.shards:
            if shard.tables:
                shard.warm(rows, grads)

    def shard_bytes(self, rows: Rows) -> list[int]:
        """Bytes each shard serves for one batch (`shard_bytes`)."""
        return shard_bytes(rows, self.placement, self._dim, self.num_shards)

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(tables, slots)`` of every table, copies (a fuzzy snapshot while workers push).

        An LRU table's entry is `lru_state` of its store's snapshot."""
        if self.lru:
            out = {}
            for shard in self.shards:
                snaps, _, _ = shard.snapshot()
                out.update({k: lru_state(v) for k, v in snaps.items()})
            return ({k: v[0] for k, v in out.items()}, {k: v[1] for k, v in out.items()})
        tables = {t.name: self.shards[self.placement[t.name]].tables[t.name].copy()
                  for t in self.layout.tables}
        slots = {t.name: jax.tree.map(np.copy, self.shards[self.placement[t.name]].slots[t.name])
                 for t in self.layout.tables}
        return tables, slots

    def restore(self, tables: dict, slots: dict) -> None:
        """Replace every shard's rows and slots with copies of the given ones."""
        for shard in self.shards:
            for k in shard.tables:
                if self.lru:
                    shard.stores[k].restore(lru_snapshot(tables[k], jax.tree.map(np.asarray,
                                                                                 slots[k])))
                    continue
                shard.tables[k] = np.array(tables[k], np.float32)
                shard.slots[k] = jax.tree.map(np.array, slots[k])


class SyncPS:
    """The sync parameter server of S-EASGD / FR-EASGD: holds ``wPS``.

    Args:
      params: initial ``wPS`` (the initial dense params).
      exchange: the jitted S-EASGD exchange ``(wPS, w_i) -> (wPS', w_i')``.
    """

    def __init__(self, params: Any, exchange):
        self.w = params
        self._exchange = exchange
        self._lock = threading.Lock()  # the server applies one request at a time

    def exchange(self, w_i: Any) -> Any:
        """One S-EASGD exchange: moves ``wPS`` towards `w_i`; returns the new ``w_i``."""
        with self._lock:
            self.w, w_i = self._exchange(self.w, w_i)
        return w_i

    def snapshot(self) -> Any:
        return self.w

    def restore(self, w: Any) -> None:
        with self._lock:
            self.w = w


def shard_bytes(rows: Rows, placement: dict[str, int], dims: dict[str, int],
                shards: int) -> list[int]:
    """Bytes each of `shards` shards serves for one batch's `rows` (rows pulled + row
    gradients pushed, f32): table name -> its shard (`placement`) and width (`dims`)."""
    out = [0] * shards
    for name, (_, n) in rows.items():
        out[placement[name]] += 2 * n * dims[name] * 4
    return out


class DensePS:
    """The async (Downpour) PS of the dense params: applies every pushed gradient at once.

    Args:
      params, opt_state: initial dense params and optax state.
      apply: jitted ``(params, opt_state, grads) -> (params, opt_state)``.
    """

    def __init__(self, params: Any, opt_state: Any, apply):
        self.params, self.opt_state, self.version = params, opt_state, 0
        self._apply = apply
        self._lock = threading.Lock()
        self.staleness: collections.Counter = collections.Counter()

    def pull(self) -> tuple[Any, int]:
        return self.params, self.version

    def push(self, grads: Any, version: int) -> None:
        """Apply `grads`, computed at `version`: staleness = updates applied since that pull."""
        grads = batched.resolve(grads)  # a virtual-clock worker's deferred gradient
        with self._lock:
            self.params, self.opt_state = self._apply(self.params, self.opt_state, grads)
            self.staleness[self.version - version] += 1
            self.version += 1

    def snapshot(self) -> tuple[Any, Any]:
        return self.params, self.opt_state

    def restore(self, params: Any, opt_state: Any) -> None:
        with self._lock:
            self.params, self.opt_state = params, opt_state
