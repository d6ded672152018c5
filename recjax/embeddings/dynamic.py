"""Dynamic-id embedding store: one table keyed by raw 64-bit ids, an LRU cache of `capacity` rows.

Persia keeps every embedding row and its optimizer state in an LRU cache built from a hash map
and an *array list*: rows live in one preallocated array, the map stores a row's index (not a
pointer), and the recency list links array indices, so there is no per-row allocation and a
snapshot is a plain copy of arrays (Lian et al., KDD 2022, Sec. 4.2.2 and Fig. 5). `LruStore`
is that design written with whole-batch numpy operations (no per-id Python loop):

* rows: ``values f32[rows, D]`` and the optimizer slots (``opt.init`` of the rows, same leading
  dim) share one *slot* index; slots ``[0, size)`` are the resident rows. The arrays double
  as the store fills, up to ``capacity`` rows (a store of a small field stays small).
* map: `IdIndex`, raw id -> slot, open addressing with linear probing, probed for all ids of
  a batch at once.
* recency: each row's last pull as one number, ``tick << 32 | position in that pull``, and an
  append-only log of ``(slot, recency)`` touches; an entry is live while its slot's recency
  still equals it. The live entries, in log order, are Persia's recency list: evicting pops
  live entries off the head (skipping stale ones), and the log drops its popped head and,
  rarely, its stale entries, so each touch costs O(1) amortised. ``snapshot()["order"]`` is
  that list.
* the optimizer: `unique_rows_update`, ``opt.update`` vmapped over one-row tables of the
  gathered rows (padded to a few fixed sizes, so jit compiles a handful of shapes).

Memory per row of capacity, besides the row and its slots (4D bytes each for adagrad): 16 B
of id and recency, 64 B of map (4 positions of 16 B: at 1/4 load probes are short and deleted
positions are mostly reused, so the map never needs rebuilding in steady state), <= 36 B of log.

Semantics (the contract `tests/test_dynamic_store.py` checks against a plain OrderedDict LRU):

* LRU at batch granularity. Every ``pull(ids)`` (``admit=True``) is one tick of a batch
  clock; each row it touches (hit or admitted) gets that tick as its stamp and moves to the
  most-recent end, in the order of ``ids``: ties between rows of one pull are broken by their
  position in that pull (the engine's ``np.unique`` order). Eviction takes the least recently
  used rows first, and never a row the same pull touched. If one pull has more new admitted
  ids than free slots plus evictable rows, the excess (its last ones in ``ids`` order) is not
  admitted: it reads its initial row and counts in ``not_admitted``.
* Admission: a new id is admitted with probability ``admit_probability``, decided by
  `admission_draws` from (seed, table name, id) alone, so runs are reproducible and an id
  refused once is refused every time.
* Initial rows: `recjax.embeddings.init_rows` of (seed, name, id): an evicted id re-admitted
  later restarts from the same row, with fresh ``opt.init`` slots.
* ``push`` applies the optimizer to resident ids only and does not touch recency (recency is
  "last pulled"); gradients of ids not resident (evicted since their pull, or never admitted)
  are dropped and counted per id in ``dropped_gradients``.
* ``pull(ids, admit=False)`` (eval) reads without admitting or touching anything, counters
  included: a resident id reads its row, any other id its initial row.

Speed (``taskset -c 0 python scripts/bench.py --sections lru_store``): 4096 x 26 Zipf(1.05)
raw ids per batch out of 10M (41k unique), a full 2^20-row store evicting 14k rows a batch,
adagrad, D = 16: pull + push ~19 ms a batch on one core (p99 21 ms over 300 batches), 5.5-5.7M
raw ids/s; 0.46x a fixed 2^20-row numpy table with the same update, 1.7x the fixed table
through today's `EmbeddingShard` path. The map is ~1/4 of the time; the row gathers/scatters,
`init_rows` and the jitted update are the rest.

Why numpy for the map. Candidates for a vectorised int64 -> int map with deletion, measured on
this project's CPU box (one core, numpy 2.4, pandas 3.1, numba 0.68) on the store's batch: a map
of 2^20 keys; per batch look up 41,000 keys (28,000 present), delete 13,000, insert 13,000;
median of 3 x 30 batches, ms per batch:

  ============================================ ======== =====================================
  map                                          ms/batch  install, upkeep
  ============================================ ======== =====================================
  numba ``njit`` open addressing, 4x positions     2.4   numba + llvmlite ~210 MB; 0.5 s
                                                         import + ~1 s compile per process
  numba ``njit`` open addressing, 2x positions     3.3   (same)
  `IdIndex` (numpy, 4x positions)                  3.4   nothing beyond numpy
  pandas ``_libs.hashtable.Int64HashTable``        4.4   pandas ~85 MB; a private module with
                                                         no delete (stale keys checked, rebuilt)
  numpy sorted array + ``searchsorted``           12.8   nothing; O(capacity) per insert
  numba typed ``Dict`` (njit loops)               14.1   numba + llvmlite ~210 MB
  ============================================ ======== =====================================

The best compiled map would save ~1 ms of a ~19 ms batch (6%) for a 210 MB dependency and a
compile step in every process, and pandas' map is no faster and not a public API: so numpy.

References:
  Lian et al., "Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to
  100 Trillion Parameters", KDD 2022, Sec. 4.2.2 (LRU cache implementation).
"""

from __future__ import annotations

import collections
import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from recjax.data.hashing import mix64
from recjax.embeddings.sparse_optim import SparseOptimizer
from recjax.embeddings.tables import init_rows

FILLER = -1  # a padding entry of `pull`/`push` ids (zero row, no gradient); never a stored key
COUNTERS = ("admitted", "evicted", "not_admitted", "dropped_gradients", "pulls", "pushes")
_EMPTY, _TOMB = -1, -2  # `IdIndex` slot markers: never used / deleted (probe past it)
_MAX_WINDOW = 32  # widest probe window of `IdIndex` (positions tested at once per key)
_MIN_BUCKET = 16  # smallest padded size of the jitted optimizer calls
_FIRST_ROWS = 1024  # rows allocated at first; the arrays double as the store fills
_RECENT_PULLS = 8  # pulls whose (ids, slots) `push` may reuse (engine staleness is smaller)


def admission_draws(seed: int, name: str, ids: np.ndarray) -> np.ndarray:
    """Uniform draws u[n] in [0, 1) from (seed, table name, id) alone; id admitted iff u < p.

    The key differs from `init_rows`' (a separate ``"admit/"`` name hash), so admission and
    initial values are independent.

    Args:
      seed: the run's seed.
      name: the table's name.
      ids: i64[n] raw ids.

    Returns:
      f64[n] draws, the same for the same (seed, name, id) in every process.
    """
    name_key = int.from_bytes(hashlib.sha256(f"admit/{name}".encode()).digest()[:8], "little")
    key = mix64(np.uint64(name_key) ^ mix64(np.uint64(seed & (2**64 - 1))))
    bits = mix64(np.asarray(ids).astype(np.uint64) ^ key)
    return ((bits >> np.uint64(11)).astype(np.float64)) * 2.0**-53


def put_rows(a: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> None:
    """``a[idx] = rows`` along axis 0 of a C-contiguous `a`, each row moved as one opaque item by
    `np.put`: 2.5x faster than numpy's fancy assignment of 2-D rows (41k cold rows of a 1M x 16
    table: 1.0 vs 2.5 ms)."""
    if a.ndim == 1 or idx.size == 0:
        a[idx] = rows
        return
    item = np.dtype((np.void, a.dtype.itemsize * int(np.prod(a.shape[1:]))))
    flat = lambda x: np.ascontiguousarray(x, a.dtype).reshape(x.shape[0], -1).view(item).reshape(-1)
    np.put(flat(a), idx, flat(rows))


class IdIndex:
    """Hash map raw id (int64) -> slot, every operation vectorised over a batch of keys.

    Open addressing with linear probing, at most 1/4 full of keys. ``table[position]`` holds
    ``(key, slot)`` side by side, so a probe costs one cache miss; slot `_EMPTY` marks a
    never-used position (a probe stops there), `_TOMB` a deleted one (a probe goes on past it;
    an insert reuses it). ``pos[slot]`` is the position of the slot's key, so `remove` needs no
    probing. Should keys plus tombstones pass 3/4 of the positions, the map rebuilds itself
    (an O(positions) step; with `remove`'s clean-up, the store's steady state levels off near
    1/4 keys + 1/10 tombstones and never gets there).

    Batch probing: every key first tests its home position (most settle there); the rest test
    windows of 2, 4, ... 32 consecutive positions at once, until each meets its key, an empty
    position (absent) or, inserting, a free one. Inserts settle conflicts by writing every
    claimant's slot into the free position and reading back which one stuck (slots are
    unique); the losers probe on past it.

    Args:
      rows: the most keys it will hold (slots are ``< rows``).
    """

    def __init__(self, rows: int):
        self.rows = rows
        self.size = max(16, 1 << (4 * rows - 1).bit_length())  # positions, >= 4 * rows
        self.table = np.zeros((self.size, 2), np.int64)
        self.table[:, 1] = _EMPTY
        self.pos = np.zeros(rows, np.intp)
        self.n_empty = self.size

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (mix64(keys) & np.uint64(self.size - 1)).astype(np.intp)

    def _probe(self, p: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Windows of positions p .. p+w-1 (wrapping): ``(positions, keys, slots)``, [n, w] each."""
        q = (p[:, None] + np.arange(w)) & (self.size - 1)
        e = self.table.take(q.reshape(-1), axis=0)
        return q, e[:, 0].reshape(q.shape), e[:, 1].reshape(q.shape)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """i64[n] slot of each key, -1 where absent."""
        home = self._home(keys)
        e = self.table.take(home, axis=0)  # round 1: the home positions, flat
        hit = (e[:, 0] == keys) & (e[:, 1] >= 0)
        out = np.where(hit, e[:, 1], -1)
        todo = np.flatnonzero(~hit & (e[:, 1] != _EMPTY))
        k, p, w = keys[todo], home[todo] + 1, 2
        while todo.size:  # a key is never past an empty position: the first stop decides
            _, key, slot = self._probe(p, w)
            hit = (key == k[:, None]) & (slot >= 0)
            first = np.arange(todo.size) * w + (hit | (slot == _EMPTY)).argmax(axis=1)
            found, slot = hit.reshape(-1)[first], slot.reshape(-1)[first]
            out[todo[found]] = slot[found]
            more = ~found & (slot != _EMPTY)
            todo, k, p, w = todo[more], k[more], p[more] + w, min(2 * w, _MAX_WINDOW)
        return out

    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Map unique `keys`, none of them present, to unique `slots`."""
        k, s, p, w = keys, slots.astype(np.int64), self._home(keys), 1
        while k.size:
            q, _, slot = self._probe(p, w)
            free = slot < 0
            first = np.arange(k.size) * w + free.argmax(axis=1)
            c = np.flatnonzero(free.reshape(-1)[first])  # claimants of a free position
            pc = q.reshape(-1)[first[c]]
            was_empty = self.table[pc, 1] == _EMPTY
            self.table[pc, 1] = s[c]  # several claimants of one position: one of them sticks
            won = self.table[pc, 1] == s[c]
            win, pw = c[won], pc[won]
            self.table[pw, 0] = k[win]
            self.pos[s[win]] = pw
            self.n_empty -= int(np.count_nonzero(was_empty[won]))
            p = p + w
            p[c] = pc + 1  # losers probe on past the position they lost
            rest = np.ones(k.size, bool)
            rest[win] = False
            k, s, p, w = k[rest], s[rest], p[rest], min(2 * w, _MAX_WINDOW)
        if self.n_empty < self.size // 4:
            self._rebuild()

    def remove(self, slots: np.ndarray) -> None:
        """Unmap the keys held by `slots`.

        A freed position is a tombstone, unless the next position is empty: then no probe
        passes through it (a probe never crosses an empty position), so it becomes empty too,
        and so in turn do the tombstones right before it. Most freed positions thus end up
        empty, and the tombstones level off instead of piling up.
        """
        p = self.pos[slots]
        self.table[p, 1] = _TOMB
        mask = self.size - 1
        while p.size:
            p = p[self.table[(p + 1) & mask, 1] == _EMPTY]
            self.table[p, 1] = _EMPTY
            self.n_empty += p.size
            p = (p - 1) & mask
            p = p[self.table[p, 1] == _TOMB]

    def _rebuild(self) -> None:
        """The same map without tombstones."""
        live = self.table[self.table[:, 1] >= 0]
        self.__init__(self.rows)
        self.insert(live[:, 0], live[:, 1])


@functools.lru_cache(maxsize=64)
def unique_rows_update(opt: SparseOptimizer) -> Any:
    """``opt.update`` for rows whose ids are unique, jitted (cached per optimizer).

    ``update(rows f32[b, D], slots, grads f32[b, D], step) -> (rows, slots)`` applies
    ``opt.update`` to each row as a one-row table, vmapped over the rows: the same update as
    one call on the mini table with local ids 0..b-1, minus the sort with which every optimizer
    first merges duplicate ids (`coalesce`), 3-10x faster for adagrad and adam at b = 32k..64k
    on one CPU core. Exact for row-wise optimizers, i.e. all of `SPARSE_OPTIMIZERS`: a row's
    update reads only that row, its slots, its gradient and the step (the tests compare the
    store against a table updated by plain ``opt.update``).
    """

    def one_row(row, slots, grad, step):
        t, s = opt.update(row[None], jax.tree.map(lambda a: a[None], slots),
                          jnp.zeros(1, jnp.int32), grad[None], step)
        return t[0], jax.tree.map(lambda a: a[0], s)

    return jax.jit(jax.vmap(one_row, in_axes=(0, 0, 0, None)))


@functools.lru_cache(maxsize=64)
def _jit_init(opt: SparseOptimizer) -> Any:
    return jax.jit(opt.init)


def _bucket(n: int) -> int:
    """Padded size of a jitted call on n rows: a power of two (>= 16), so few sizes compile
    (`algorithms.runtime.ps.LruShard.warm` compiles them all before threads start)."""
    return max(_MIN_BUCKET, 1 << max(n - 1, 0).bit_length())


def padded_rows(a: np.ndarray, idx: np.ndarray, b: int) -> np.ndarray:
    """``a[idx]`` (along axis 0) in the first rows of a zero array of b rows."""
    out = np.zeros((b,) + a.shape[1:], a.dtype)
    a.take(idx, axis=0, out=out[:idx.size], mode="clip")  # "clip": unbuffered
    return out


class LruStore:
    """One embedding table whose rows are keyed by raw int64 ids, at most `capacity` rows.

    See the module docstring for the semantics. Host numpy arrays throughout; only the sparse
    optimizer runs jitted, on the touched rows padded to a few fixed sizes (`_bucket`).
    Not thread-safe: one caller at a time (Persia locks a shard per request, Sec. 4.2.2).

    Args:
      name: the table's name (seeds its initial rows and admission draws).
      dim: D, columns of a row.
      capacity: most rows resident at once (>= 1).
      opt: the sparse optimizer; its slots live beside each row.
      seed: the run's seed.
      init: `init_rows`' scale: "dlrm" (U(+-1/sqrt(capacity))) or the std of a normal.
      admit_probability: chance that a new id is admitted, in (0, 1].

    Attributes:
      counters: ints: ``admitted`` ids admitted, ``evicted`` rows evicted, ``not_admitted`` new
        ids read but not stored (refused by the draw, or no room in their pull),
        ``dropped_gradients`` ids whose gradient found no resident row, ``pulls`` training
        (``admit=True``) pulls, ``pushes``.
      size: rows resident now.
    """

    def __init__(self, name: str, dim: int, capacity: int, opt: SparseOptimizer, *, seed: int,
                 init: str | float = "dlrm", admit_probability: float = 1.0):
        if capacity < 1:
            raise ValueError(f"LruStore {name!r}: capacity must be >= 1 row, got {capacity}")
        if dim < 1:
            raise ValueError(f"LruStore {name!r}: dim must be >= 1, got {dim}")
        if not 0.0 < admit_probability <= 1.0:
            raise ValueError(f"LruStore {name!r}: admit_probability must be in (0, 1], got "
                             f"{admit_probability}")
        self.name, self.dim, self.capacity = name, dim, capacity
        self.opt, self.seed, self.init = opt, seed, init
        self.admit_probability = admit_probability
        self._init_slots, self._update = _jit_init(opt), unique_rows_update(opt)
        shapes = jax.eval_shape(opt.init, jax.ShapeDtypeStruct((1, dim), jnp.float32))
        self._clear(jax.tree.map(lambda sd: np.zeros((0,) + sd.shape[1:], sd.dtype), shapes))

    def _clear(self, empty_slots: Any) -> None:
        """An empty store: no rows, clock 0, counters 0."""
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.size = 0
        self._clock = 0  # admit pulls so far: the batch clock
        # per slot: raw id, recency, row, optimizer slots. Recency is ``tick << 32 | position``
        # of the row's last pull (its clock tick and its index in that pull's ids): the LRU
        # order is the order of these numbers, and ``recency >> 32`` is the row's stamp.
        self.keys, self._recency = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.values, self.slots = np.zeros((0, self.dim), np.float32), empty_slots
        self._alloc(min(self.capacity, _FIRST_ROWS))
        self._log_slot = np.zeros(_FIRST_ROWS, np.int32)  # recency log, oldest first: (slot,
        self._log_rec = np.zeros(_FIRST_ROWS, np.int64)  # its recency then)
        self._head = self._tail = 0
        self._recent = collections.deque(maxlen=_RECENT_PULLS)  # (ids, slots) of training pulls

    # ---- storage ----------------------------------------------------------------------------

    def _alloc(self, rows: int) -> None:
        """(Re)allocate the per-slot arrays for `rows` slots, keeping the first `size`."""

        def grow(a, fill=0):
            new = np.full((rows,) + a.shape[1:], fill, a.dtype)
            new[:self.size] = a[:self.size]
            return new

        self.keys, self._recency = grow(self.keys), grow(self._recency, -1)
        self.values = grow(self.values)
        self.slots = jax.tree.map(grow, self.slots)
        self._index = IdIndex(rows)
        self._index.insert(self.keys[:self.size], np.arange(self.size))

    def _reserve(self, rows: int) -> None:
        if rows > self.keys.size:
            self._alloc(min(self.capacity, max(rows, 2 * self.keys.size)))

    def _check_ids(self, ids: Any, op: str) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype != np.int64:
            raise TypeError(f"LruStore {self.name!r}.{op}: ids must be int64 raw ids, got {ids.dtype} "
                            "(cast with .astype(np.int64); a narrower type would alias 64-bit ids)")
        if ids.ndim != 1:
            raise ValueError(f"LruStore {self.name!r}.{op}: ids must be 1-D, got shape {ids.shape}")
        return ids

    def _init_rows(self, ids: np.ndarray) -> np.ndarray:
        return init_rows(self.seed, self.name, ids, self.dim, num_embeddings=self.capacity,
                         scale=self.init)

    # ---- recency log ------------------------------------------------------------------------

    def _log_append(self, slots: np.ndarray, recency: np.ndarray) -> None:
        n, cap = slots.size, self._log_slot.size
        if self._tail + n > cap:  # full: drop the popped head (a copy); if that is not enough,
            s = self._log_slot[self._head:self._tail]  # the stale entries too (a gather), and
            q = self._log_rec[self._head:self._tail]  # keep room for 3x the live ones: in steady
            if s.size + n > 3 * cap // 4:  # state (evicting) the log spans ~1.6x the rows
                s, q = self._live_log()
                if 3 * (s.size + n) > cap:
                    self._log_slot = np.zeros(3 * (s.size + n), np.int32)
                    self._log_rec = np.zeros(3 * (s.size + n), np.int64)
            self._log_slot[:s.size], self._log_rec[:s.size] = s, q  # (numpy copies overlaps)
            self._head, self._tail = 0, s.size
        self._log_slot[self._tail:self._tail + n] = slots
        self._log_rec[self._tail:self._tail + n] = recency
        self._tail += n

    def _live_log(self) -> tuple[np.ndarray, np.ndarray]:
        s, q = self._log_slot[self._head:self._tail], self._log_rec[self._head:self._tail]
        live = self._recency[s] == q
        return s[live], q[live]

    def _pop_lru(self, m: int) -> np.ndarray:
        """The m least recently used slots, off the head of the log (m <= live entries)."""
        out = [np.zeros(0, np.int32)]
        while m:
            assert self._head < self._tail, "recency log lost a resident row"
            end = min(self._tail, self._head + max(4 * m, 4096))
            s = self._log_slot[self._head:end]
            live = np.flatnonzero(self._recency[s] == self._log_rec[self._head:end])[:m]
            out.append(s[live])
            m -= live.size
            self._head = self._head + int(live[-1]) + 1 if m == 0 else end
        return np.concatenate(out)

    # ---- the API ----------------------------------------------------------------------------

    def pull(self, ids: np.ndarray, admit: bool = True) -> np.ndarray:
        """The rows of `ids`, admitting new ids (a training pull) or not (eval).

        Args:
          ids: i64[n] unique raw ids; entries equal to -1 are filler.
          admit: True: one tick of the batch clock (touch, admit, evict; see the module
            docstring). False: read only, nothing changes.

        Returns:
          f32[n, D]: resident rows, initial rows of other ids, zeros for filler.
        """
        ids = self._check_ids(ids, "pull")
        slot = self._index.lookup(ids)  # filler is never a key: -1
        filler = ids == FILLER
        new = np.flatnonzero((slot < 0) & ~filler)
        init = self._init_rows(ids[new])
        if admit:
            self._admit(ids, slot, new, init)
            self._recent.append((ids.copy(), slot))
        out = self.values.take(np.maximum(slot, 0), axis=0)  # slot: after admission
        out_of_store = slot[new] < 0
        put_rows(out, new[out_of_store], init[out_of_store])
        if filler.any():
            out[filler] = 0.0
        return out

    def _admit(self, ids, slot, new, init) -> None:
        """One training tick: touch the hits, evict, admit; updates `slot` in place."""
        self._clock += 1
        self.counters["pulls"] += 1
        base = self._clock << 32  # recency of this pull's position 0
        hit = np.flatnonzero(slot >= 0)
        hs = slot[hit]
        self._recency[hs] = base + hit  # hits: most recent now, so not evictable by this pull
        cand = np.arange(new.size)  # indices into `new` of the ids that may be admitted
        if self.admit_probability < 1.0:
            cand = np.flatnonzero(admission_draws(self.seed, self.name, ids[new])
                                  < self.admit_probability)
        free = self.capacity - self.size
        evict = min(max(cand.size - free, 0), self.size - hs.size)
        cand = cand[:free + evict]  # the excess of one pull is not admitted
        fresh = cand.size - evict  # admitted into never-used slots
        victims = self._pop_lru(evict)
        self._reserve(self.size + fresh)
        to = np.concatenate([np.arange(self.size, self.size + fresh), victims]).astype(np.int64)
        self._index.remove(victims)
        pos = new[cand]
        self._index.insert(ids[pos], to)
        slot[pos] = to
        self.size += fresh
        self.keys[to] = ids[pos]
        self._recency[to] = base + pos
        rows = init.take(cand, axis=0)
        put_rows(self.values, to, rows)
        if jax.tree.leaves(self.slots) and to.size:
            fresh_slots = self._init_slots(padded_rows(rows, np.arange(to.size), _bucket(to.size)))
            jax.tree.map(lambda a, f: put_rows(a, to, np.asarray(f)[:to.size]), self.slots,
                         fresh_slots)
        touched = np.flatnonzero(slot >= 0)  # in pull order: the tie-break of this tick
        self._log_append(slot[touched].astype(np.int32), base + touched)
        c = self.counters
        c["admitted"] += int(cand.size)
        c["evicted"] += evict
        c["not_admitted"] += int(new.size - cand.size)

    def _resident_slots(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 if not resident: a lookup, or, for the ids of a recent training
        pull (the usual push), that pull's slots where they still hold their ids."""
        for old_ids, old_slot in reversed(self._recent):
            if old_ids.shape == ids.shape and np.array_equal(old_ids, ids):
                slot = old_slot.copy()  # stale: not admitted then, or evicted since
                stale = (slot < 0) | (self.keys.take(np.maximum(slot, 0)) != ids)
                redo = np.flatnonzero(stale & (ids != FILLER))
                slot[stale] = -1
                slot[redo] = self._index.lookup(ids[redo])
                return slot
        return self._index.lookup(ids)

    def push(self, ids: np.ndarray, grads: np.ndarray, step: int) -> None:
        """Apply row gradients to the resident rows; drop (and count) the others.

        Args:
          ids: i64[n] unique raw ids; -1 entries are filler (ignored).
          grads: f32[n, D] one gradient row per id (summed over the batch already).
          step: the sparse optimizer's step (Adam's bias correction).
        """
        ids = self._check_ids(ids, "push")
        grads = np.asarray(grads)
        if grads.shape != (ids.size, self.dim):
            raise ValueError(f"LruStore {self.name!r}.push: grads must be [len(ids), dim] = "
                             f"[{ids.size}, {self.dim}], got {list(grads.shape)}")
        self.counters["pushes"] += 1
        slot = self._resident_slots(ids)
        res = np.flatnonzero(slot >= 0)
        self.counters["dropped_gradients"] += int(np.count_nonzero(ids != FILLER)) - res.size
        if res.size == 0:
            return
        rs, n, b = slot[res], res.size, _bucket(res.size)
        rows, slots = self._update(padded_rows(self.values, rs, b),
                                   jax.tree.map(lambda a: padded_rows(a, rs, b), self.slots),
                                   padded_rows(grads.astype(np.float32, copy=False), res, b),
                                   np.int32(step))
        put_rows(self.values, rs, np.asarray(rows)[:n])
        jax.tree.map(lambda a, f: put_rows(a, rs, np.asarray(f)[:n]), self.slots, slots)

    def snapshot(self) -> dict:
        """The whole store as numpy arrays (copies), fixed shapes of `capacity` rows.

        A fresh ``LruStore`` of the same arguments gives the ``like`` tree that
        `recjax.checkpoint.Checkpointer.restore` needs. Rows past ``size`` are zero.

        Returns:
          ``keys i64[C]``, ``stamps i64[C]`` (batch tick of the last pull), ``values f32[C, D]``,
          ``slots`` (pytree, leading dim C), ``order i32[C]`` (``order[:size]``: the resident
          slots, least recently used first; -1 after), ``size``, ``clock`` and ``counters``
          (name -> 0-d i64).
        """
        c, n = self.capacity, self.size

        def full(a):
            out = np.zeros((c,) + a.shape[1:], a.dtype)
            out[:n] = a[:n]
            return out

        order = np.full(c, -1, np.int32)
        order[:n] = self._live_log()[0]
        return {"keys": full(self.keys), "stamps": full(self._recency >> 32),
                "values": full(self.values),
                "slots": jax.tree.map(full, self.slots), "order": order,
                "size": np.array(n, np.int64), "clock": np.array(self._clock, np.int64),
                "counters": {k: np.array(v, np.int64) for k, v in self.counters.items()}}

    def restore(self, snap: dict) -> None:
        """Become the store `snap` was taken from (same future reads, admissions, evictions)."""
        values, keys = np.asarray(snap["values"]), np.asarray(snap["keys"])
        if values.shape != (self.capacity, self.dim):
            raise ValueError(f"LruStore {self.name!r}.restore: snapshot values are "
                             f"{list(values.shape)}, this store is [capacity, dim] = "
                             f"[{self.capacity}, {self.dim}]")
        if keys.dtype != np.int64:
            raise TypeError(f"LruStore {self.name!r}.restore: snapshot keys are {keys.dtype}, not "
                            "int64 (were they cast on the way, e.g. by jnp.asarray with x64 off?)")
        n = int(snap["size"])
        self._clear(jax.tree.map(lambda a: np.asarray(a)[:0], snap["slots"]))
        self.size = n  # rows [0, n) as in the snapshot
        self.keys = keys
        self.values, self.slots = values, jax.tree.map(np.asarray, snap["slots"])
        order = np.asarray(snap["order"][:n], np.int32)
        self._recency = np.full(self.capacity, -1, np.int64)  # tick, then order within a tick
        self._recency[order] = (np.asarray(snap["stamps"])[order] << 32) + np.arange(n)
        self._alloc(max(min(self.capacity, _FIRST_ROWS), n))  # copies, and builds the index
        self._log_append(order, self._recency[order])
        self._clock = int(snap["clock"])
        self.counters = {k: int(snap["counters"][k]) for k in COUNTERS}
