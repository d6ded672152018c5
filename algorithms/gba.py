"""GBA: global-batch gradient aggregation on a PS, and the baselines it is compared with.

Su et al., "GBA: A Tuning-free Approach to Switch between Synchronous and Asynchronous
Training for Recommendation Models", NeurIPS 2022 (Sec. 4.1, App. B Alg. 1-2, Sec. 5.1).
Symbols as in the paper: ``B_a`` local batch, ``N_a`` workers, ``M`` gradients per global step
(the buffer), ``k`` the global step, ``t_i`` the token of data-list entry i, ``iota`` the
staleness threshold of Eq. 1.

* Workers (Alg. 1): loop { take entry i of the shared data list with its token
  ``t_i = floor(i / M)``; pull the dense params and the batch's rows; compute; push
  (gradients, token) without waiting }. Fast workers take more entries. The printed formula
  is ``floor(i / K)``; the text says each token repeats M times, which only ``floor(i / M)``
  satisfies (../shared/papers/README.md).
* PS (Alg. 2, Eq. 1): a buffer of M gradients; when full, the dense part of a gradient with
  ``k - t > iota`` is dropped and the kept ones are summed and divided by M (l. 20, 22;
  ``gba.dense_mean``). Each embedding row is judged apart from its dense part, by Eq. 1 with
  its id's tag (the global step after the row's last update) in place of k (l. 19, 21;
  ``gba.embedding_staleness``), so a stale gradient's rows of scarce ids survive; an id's
  applied rows are summed and divided by how many gradients met the id (l. 23;
  ``gba.embedding_mean``). One optimizer step is applied, ``k += 1``. Where Alg. 2 is
  ambiguous (the order of l. 19 and 21, the divisor), docs/gba.md says how it is read. One PS
  (PS0) owns k and the buffer: its apply is one event, so every table shard applies the same
  global step (docs/gba.md: the paper's shards each keep a buffer and leave open how they
  agree on k).

The baselines run on the same PS, workers and data list (Sec. 5.1; ``--gba.mode``):

* ``sync``: every worker computes one gradient per global step at the current params and
  waits for the step; the step aggregates all N (the all-reduce of synchronous training, on a
  PS).
* ``async``: every pushed gradient is applied at once.
* ``hop_bs``: N gradients per update, as sync, but a worker may run up to ``b1`` batches
  ahead of the slowest worker before it waits (bounded staleness).
* ``bsp``: every ``b2`` gradients are aggregated, whatever their version; nobody waits.
* ``hop_bw``: a step closes when ``N - b3`` gradients computed at the current params arrived;
  the ``b3`` slowest of that round arrive late and are dropped (backup workers).

Aggregation in the baselines follows the same PS rules (per-row embedding mean, division by
the gradients aggregated), so that with equal-speed workers ``bsp`` with ``b2 = N``,
``hop_bw`` with ``b3 = 0``, ``hop_bs`` with ``b1 = 0`` and ``gba`` with ``M = N`` all run the
sync schedule exactly (tests/test_gba.py).

    python scripts/train.py --algo gba --gba.mode gba --gba.workers 4 --stragglers slow:k=1,factor=4
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
from collections.abc import Callable
from typing import Any, Literal, get_args

import jax
import numpy as np

from algorithms import gba_rows
from algorithms.gba_counts import Stats, additive, whole_run
from algorithms.gba_tags import RowTags
from algorithms.runtime import (
    RoleSpec,
    Runtime,
    Signal,
    Wait,
    Worker,
    WorkerLost,
    histogram_summary,
    intervals,
)
from algorithms.runtime.batched import resolve
from algorithms.runtime.ps import Rows
from algorithms.runtime.supply import EntryIndex
from recjax.config import Config
from recjax.train.setup import make_dense_tx
from recjax.train.step import apply_dense

WaitsFor = Literal["nothing", "step", "slowest"]
Drops = Literal["nothing", "late", "stale"]


@dataclasses.dataclass(frozen=True)
class ModeRule:
    """What a ``--gba.mode`` waits for, when it aggregates and what it drops: one row of `MODES`.
    `plan` and `GbaServer` read the row, never the mode's name (tests/test_mode_tables.py).

    Attributes:
      waits_for: what a worker waits for before it takes its next batch (`GbaServer.may_start`):
        ``nothing``; ``step``, the global step after the one it pulled (one gradient per worker
        per step); ``slowest``, the slowest active worker, once ``b1`` batches ahead of it.
      aggregates: gradients per update from ``(M, N, gba config)``: the PS aggregates when its
        buffer holds that many (`aggregation`; of gradients computed at k where `drops` is
        ``late``).
      per_worker: `aggregates` counts the N workers, so a lost worker lowers it
        (`GbaServer.lose`).
      drops: what the PS drops: ``nothing``; ``late``, a gradient pulled before k, whose round
        closed without it (`admits`), and only gradients at k count towards an update;
        ``stale``, Eq. 1's ``k - t > iota`` on the dense part, with GBA's own options
        ``dense_mean=kept`` and ``embedding_staleness=id`` (App. B Alg. 2 l. 20-23;
        `aggregation`).
      paper: where the paper defines the mode.
    """

    waits_for: WaitsFor
    aggregates: Callable[[int, int, Any], int]
    per_worker: bool = False
    drops: Drops = "nothing"
    paper: str = ""

    def __post_init__(self):
        for field, kind in (("waits_for", WaitsFor), ("drops", Drops)):
            if getattr(self, field) not in get_args(kind):
                raise ValueError(f"ModeRule.{field}={getattr(self, field)!r}: one of "
                                 f"{get_args(kind)}")


# Sec. 5.1's baselines on GBA's PS (module docstring); the keys are config_async.GBA_MODES.
MODES: dict[str, ModeRule] = {
    "gba": ModeRule("nothing", lambda m, n, gc: m, drops="stale",
                    paper="Sec. 4.1 (buffer of M = B_s N_s / B_a), Eq. 1, App. B Alg. 2"),
    "sync": ModeRule("step", lambda m, n, gc: n, per_worker=True,
                     paper="Sec. 3.1 (synchronous training: every worker's gradient, one version)"),
    "async": ModeRule("nothing", lambda m, n, gc: 1,
                      paper="Sec. 3.1 (asynchronous PS training: each gradient applied alone)"),
    "hop_bs": ModeRule("slowest", lambda m, n, gc: n, per_worker=True,
                       paper="Sec. 5.1 (Hop-BS: fastest-slowest version gap bounded by b1), "
                             "Table 5.1"),
    "bsp": ModeRule("nothing", lambda m, n, gc: gc.b2 or n,
                    paper="Sec. 5.1 (BSP: b2 gradients per update, whatever their version), "
                          "Table 5.1"),
    "hop_bw": ModeRule("step", lambda m, n, gc: n - gc.b3, per_worker=True, drops="late",
                       paper="Sec. 5.1 (Hop-BW: the b3 slowest workers' gradients ignored in "
                             "each aggregation), Table 5.1"),
}


@dataclasses.dataclass(frozen=True)
class Update:
    """One update of the PS, as `aggregation` decides it. Attributes:
      entries: the buffer's gradients in data-list order (the summation order).
      keep: each one's dense verdict: Eq. 1, ``k - t <= iota``, under `ModeRule.drops`
        ``stale``; True otherwise.
      denominator: what the kept dense gradients' sum is divided by: the kept ones under
        ``stale`` with ``gba.dense_mean=kept``, else every entry (Alg. 2 l. 22's M).
      per_id: embedding rows are judged by their id's tag (App. B l. 21,
        ``gba.embedding_staleness=id`` under ``stale``), not by their gradient's `keep`.
    """

    entries: tuple
    keep: tuple[bool, ...]
    denominator: int
    per_id: bool


def admits(rule: ModeRule, version: int, k: int) -> bool:
    """Whether the PS at version `k` buffers a gradient computed at `version`; under `drops`
    ``late`` one of a closed round (``version < k``: a backup worker's) is dropped at once."""
    return not (rule.drops == "late" and version < k)


def aggregation(rule: ModeRule, gc: Any, k: int, buffer: list, need: int) -> Update | None:
    """The update `buffer` makes at version `k` under `rule` (gba config `gc`), or None while
    it holds fewer than `need` gradients that count (`ModeRule.aggregates`; under `drops`
    ``late`` only those computed at k count). ``need = 0``: the update of whatever is left (the
    end of the data list)."""
    counted = [g for g in buffer if g.version == k] if rule.drops == "late" else buffer
    if not buffer or len(counted) < need:
        return None
    entries = tuple(sorted(buffer, key=lambda e: e.index))  # summation order: deterministic
    stale = rule.drops == "stale"
    keep = tuple(not stale or k - e.token <= gc.iota for e in entries)  # Eq. 1: f = 0 past iota
    denominator = sum(keep) if stale and gc.dense_mean == "kept" else len(entries)
    return Update(entries, keep, denominator, per_id(rule, gc))


def per_id(rule: ModeRule, gc: Any) -> bool:
    """Whether embedding rows are judged by their id's tag (App. B l. 21): GBA's own
    ``embedding_staleness=id`` option of the ``stale`` rule."""
    return rule.drops == "stale" and gc.embedding_staleness == "id"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The resolved sizes of a GBA run.

    Attributes:
      mode: gba | sync | async | hop_bs | bsp | hop_bw.
      workers: N_a.
      local_batch: B_a.
      m: M, data-list entries per global step (global batch = M x B_a = train.batch_size).
      aggregate: gradients per update (the mode's `ModeRule.aggregates`).
    """

    mode: str
    workers: int
    local_batch: int
    m: int
    aggregate: int


def plan(cfg: Config) -> Plan:
    """Resolve B_a, M, N_a (Sec. 4.1: ``M = B_s N_s / B_a``, ``N_a = M``) and the update size.

    Raises:
      ValueError: sizes that do not divide, or a baseline whose knob does not fit N.
    """
    g, gc = cfg.train.batch_size, cfg.gba
    b_a = gc.local_batch_size or g // (gc.workers or 4)
    if b_a < 1 or (not gc.buffer and g % b_a):
        raise ValueError(f"gba: train.batch_size={g} (the global batch) is not a multiple of the "
                         f"local batch B_a={b_a}; set --gba.local_batch_size to a divisor of it "
                         "(or --gba.buffer explicitly)")
    m = gc.buffer or g // b_a
    if m * b_a != g:
        raise ValueError(f"gba: M x B_a = {m} x {b_a} = {m * b_a} differs from train.batch_size="
                         f"{g}; the global batch must stay the sync run's (Sec. 4.1)")
    n = gc.workers or m
    agg = MODES[gc.mode].aggregates(m, n, gc)
    if agg < 1:  # hop_bw's backup workers are the only way there
        raise ValueError(f"gba.b3={gc.b3} backup workers leave no gradient of {n} workers to "
                         "aggregate; use b3 < gba.workers")
    return Plan(gc.mode, n, b_a, m, agg)


@dataclasses.dataclass
class Grad:
    """One pushed gradient. Attributes:
      wid: the worker.
      index: its data-list entry i.
      token: t_i = floor(i / M).
      version: the PS version (updates applied) the worker pulled.
      dense: dense gradient pytree.
      rows: the batch's unique ids per table (`ps.localize`).
      sums: per table, one summed gradient row per unique id, in the order of ``rows``: the
        n real rows at least (a Ray worker actor sends those only; past n they are zero).
    """

    wid: int
    index: int
    token: int
    version: int
    dense: Any
    rows: Rows
    sums: dict


class GbaServer:
    """PS0 of GBA: the dense params, the gradient buffer, k and the update rule of the mode.

    The embedding tables stay on the run's `EmbeddingPS` shards; an update pushes one
    aggregated gradient per table to them (so Adam's step count advances once per update).
    Pushes and updates hold one lock (the PS applies one request at a time); pulls read the
    current values without it.

    Args:
      rt: what the server reads of the run's engine (`server_context`: values, so that the
        server can be built in a process of its own).
      p: the resolved sizes.
      params, opt_state: the dense state to continue from.
    """

    def __init__(self, rt: Runtime, p: Plan, params: Any, opt_state: Any):
        self.rt, self.p, self.gc = rt, p, rt.cfg.gba
        self.rule = MODES[p.mode]
        self.params, self.opt_state = params, opt_state
        self.version = rt.start_step  # k: updates applied, counted on from the checkpoint
        self.signal = Signal("gba-ps")
        self.stats = Stats()
        self.buffer: list[Grad] = []
        self.pulled = [-1] * p.workers  # version each worker last pulled (sync/hop_bw gate)
        self.pushed = [0] * p.workers  # gradients each worker pushed (hop_bs gate)
        self.active = set(range(p.workers))
        self.aggregate = p.aggregate  # gradients per update; a lost worker lowers N's
        self.lost: list[int] = []
        self.exhausted = False
        self.accounted = 0  # data-list entries whose gradient was applied or dropped
        self._lock = threading.Lock()
        # App. B Alg. 2 l. 19: the global step at which each row was last updated (keyed by
        # raw 64-bit id under embed.store=lru, whose ids are not row indices)
        self.tag = RowTags(((t.name, t.num_embeddings) for t in rt.model.layout.tables),
                           raw_ids=rt.cfg.embed.store == "lru")
        # Alg. 2: PS0 hands out the list's entries (indices: `Runtime.shared_list`)
        self.entries = EntryIndex(rt.start_step * p.m, rt.total_steps * p.m)

    # -- the workers' side ------------------------------------------------------------------
    def may_start(self, wid: int) -> bool:
        """Whether worker `wid` may take its next batch (the mode's `ModeRule.waits_for`)."""
        if self.exhausted:
            return True
        waits_for = self.rule.waits_for
        if waits_for == "step":  # one gradient per worker per global step
            return self.version > self.pulled[wid]
        if waits_for == "slowest":  # at most b1 batches ahead of the slowest active worker
            return self.pushed[wid] - min((self.pushed[v] for v in self.active),
                                          default=self.pushed[wid]) <= self.gc.b1
        return True

    def next_entry(self) -> int | None:
        return self.entries.next_entry()

    def pull(self, wid: int) -> tuple[Any, int]:
        """The current dense params and their version (the worker records it)."""
        params, version = self.params, self.version
        self.pulled[wid] = version
        return params, version

    def leave(self, wid: int) -> None:
        """Worker `wid` found the data list empty: release every gate."""
        with self._lock:
            self.active.discard(wid)
            self.exhausted = True
        self.signal.notify()

    def lose(self, wid: int) -> None:
        """Worker `wid`'s process died (``--backend ray``): its in-flight entry is gone (GBA:
        its token never returns), the others go on. The modes that wait for all N workers
        (sync, hop_bs, hop_bw) aggregate one gradient fewer from now on."""
        with self._lock:
            self.active.discard(wid)
            self.lost.append(wid)
            if self.rule.per_worker and self.aggregate > 1:
                self.aggregate -= 1
                self._update(self.aggregate)  # the others may all be waiting for it
        self.signal.notify()

    def push(self, g: Grad) -> None:
        """Buffer `g`; apply an update when the mode's rule says so (Alg. 2, push threads)."""
        with self._lock:
            self.pushed[g.wid] += 1
            if admits(self.rule, g.version, self.version):
                self.buffer.append(g)
                self._update(self.aggregate)
            else:  # its round closed without it: a backup worker's
                self.stats.dropped += 1
                self.accounted += 1
        self.signal.notify()

    def _update(self, need: int) -> None:
        """Apply the update the buffer makes (`aggregation`), if it makes one."""
        u = aggregation(self.rule, self.gc, self.version, self.buffer, need)
        if u is not None:
            self._apply(u)
            self.buffer = []

    def snapshot(self) -> tuple[Any, Any, int]:
        """``(dense params, optimizer state, k)``: the tables are the embedding PS's own."""
        return self.params, self.opt_state, self.version

    def restore(self, params: Any, opt_state: Any, version: int) -> None:
        with self._lock:
            self.params, self.opt_state, self.version = params, opt_state, version
        self.signal.notify()

    def flush(self) -> None:
        """Apply what is left in the buffer at the end of the data list (no role runs)."""
        self._update(0)

    # -- the update -------------------------------------------------------------------------
    def _apply(self, u: Update) -> None:
        """One update (Eq. 1 and Alg. 2 l. 17-23, as `aggregation` decided it); k += 1."""
        rt, k = self.rt, self.version
        kept = [e for e, ok in zip(u.entries, u.keep) if ok]
        self.stats.dropped += len(u.entries) - len(kept)
        self.stats.applied += len(kept)
        self.accounted += len(u.entries)
        for e in kept:
            self.stats.dense_staleness[k - e.version] += 1
        if kept:
            total = gba_rows.tree_sum([e.dense for e in kept])
            mean = total if u.denominator == 1 else _tree_scale(total, 1.0 / u.denominator)
            self.params, self.opt_state = rt.dense_apply(self.params, self.opt_state, mean)
        # App. B Alg. 2 l. 20-21: the dense part is judged by k - token (Eq. 1), each embedding
        # row apart from it, by its id's tag - token (`_apply_rows`): the rows of a gradient
        # whose dense part Eq. 1 dropped are judged too, and a scarce id's row survives.
        if kept or u.per_id:
            self._apply_rows(u)
        self.stats.updates += 1
        self.version += 1

    def _apply_rows(self, u: Update) -> None:
        """Per table: the rows' f (Alg. 2 l. 21), then each id's f-weighted sum over the
        gradients that touched it, divided by how many touched it (l. 23).

        A row's f is 1 or 0: under ``embedding_staleness=id`` it is Eq. 1 with the id's tag (the
        update after the row's last one, `RowTags`) in place of k, ``tag - t <= iota``; under
        ``token`` (and in the baselines) it is its gradient's own Eq. 1 verdict `keep`. A row
        with f = 0 is not applied but its gradient still *encountered* the id: it counts in
        ``embedding_mean=touched``'s denominator, as a dropped gradient counts in l. 22's
        ``N_a`` (docs/gba.md).

        """
        rt, gc, k = self.rt, self.gc, self.version
        entries, keep = u.entries, u.keep
        n_entries = len(entries)
        if n_entries == 1 and keep[0] and not u.per_id:
            # one gradient (async, or a buffer of one): its rows are unique already and each
            # was touched once, so the mean is the sum; push it as it came
            e = entries[0]
            scale = 1.0 if gc.embedding_mean == "touched" else 1.0 / n_entries
            stale = []
            for name, (ids, n) in e.rows.items():
                stale.append(np.maximum(self.tag.get(name, ids[:n]) - e.version, 0))
                self.tag.set(name, ids[:n], k + 1)
            self.stats.add_rows(np.concatenate(stale))
            rt.ps.push_sums(e.rows, {name: e.sums[name] if scale == 1.0
                                     else np.asarray(e.sums[name]) * np.float32(scale)
                                     for name in e.rows})
            return
        cap = self.p.aggregate * rt.batch_size * rt.max_len  # fixed shapes: one compile
        fixed = not self.tag.raw_ids  # a fixed table's update has at most V distinct ids
        rows: Rows = {}
        sums: dict[str, np.ndarray] = {}
        stale_all = []
        version = np.array([e.version for e in entries], np.int64)
        token = np.array([e.token for e in entries], np.int64)  # t of each gradient
        for group in gba_rows.by_dim(rt.model.layout.tables):
            # every table of one row width at once (issue 35: ~30 numpy calls per update, not
            # per table); row r is table tix[r]'s id ids[r] from gradient eix[r], in table
            # then buffer order, so each (table, id)'s rows sort in buffer order as before
            n_of = [e.rows[t.name][1] for t in group for e in entries]
            ids = np.concatenate([e.rows[t.name][0][:e.rows[t.name][1]]
                                  for t in group for e in entries])
            g = np.concatenate([np.asarray(e.sums[t.name])[:e.rows[t.name][1]]
                                for t in group for e in entries])
            eix = np.repeat(np.tile(np.arange(n_entries), len(group)), n_of)
            per_table = np.add.reduceat(n_of, np.arange(0, len(n_of), n_entries)) \
                if n_of else np.zeros(0, np.int64)
            tix = np.repeat(np.arange(len(group)), per_table)
            bounds = np.r_[0, np.cumsum(per_table)]
            tag = np.concatenate([self.tag.get(t.name, ids[bounds[i]:bounds[i + 1]])
                                  for i, t in enumerate(group)])
            if u.per_id:
                ok = tag - token[eix] <= gc.iota  # l. 21: Eq. 1 with the id's tag for k
                self.stats.dropped_rows += int((~ok).sum())
            else:
                ok = np.asarray(keep, bool)[eix]
            stale_all.append(np.maximum(tag - version[eix], 0)[ok])
            uniq, utix, summed = gba_rows.aggregate(ids, tix, g, ok,
                                                    gc.embedding_mean == "touched", n_entries)
            cut = np.searchsorted(utix, np.arange(len(group) + 1))
            for i, t in enumerate(group):
                u_t = uniq[cut[i]:cut[i + 1]]
                size = cap * len(t.field_index)  # a fixed table's ids are its V rows at most:
                if fixed:  # padding past V would only add rows that push zero (issue 35)
                    size = min(size, t.num_embeddings)
                padded = np.full(size, t.num_embeddings, np.int64)
                padded[:u_t.size] = u_t
                rows[t.name] = (padded, u_t.size)  # fixed M; the rows past u_t.size push zero
                sums[t.name] = summed[cut[i]:cut[i + 1]]
                self.tag.set(t.name, u_t, k + 1)  # l. 19: the ids updated in this global step
        self.stats.add_rows(np.concatenate(stale_all))
        rt.ps.push_sums({t.name: rows[t.name] for t in rt.model.layout.tables}, sums)

    # -- reporting --------------------------------------------------------------------------
    def record(self) -> dict:
        """The counters so far (metrics.jsonl `counters` records)."""
        s = self.stats
        return {"updates": s.updates, "applied": s.applied,
                "dropped": s.dropped, "dropped_rows": s.dropped_rows,
                "dense_staleness_mean": histogram_summary(dict(s.dense_staleness))["mean"]}

    def counters(self, seconds: float, iterations: list[int]) -> dict:
        """The summary's GBA counters; `iterations`: each worker's iterations."""
        s = self.stats
        local = [it * self.p.local_batch / max(seconds, 1e-12) for it in iterations]
        emb = histogram_summary(dict(enumerate(s.emb_staleness.tolist())))
        return {
            "gba_mode": self.p.mode, "gba_workers": self.p.workers,
            "gba_local_batch_size": self.p.local_batch, "gba_M": self.p.m,
            "gba_aggregate": self.p.aggregate, "gba_iota": self.gc.iota,
            "global_qps": sum(local), "local_qps": local,
            "local_qps_mean": sum(local) / len(local),
            "tokens_handed_out": sum(iterations), "lost_workers": self.lost,
            "updates": s.updates, "gradients_applied": s.applied, "dropped_gradients": s.dropped,
            "dropped_embedding_rows": s.dropped_rows, "tagged_ids": self.tag.count(),
            "dense_staleness": histogram_summary(dict(s.dense_staleness)),
            "embedding_staleness": emb,
        }


def _tree_scale(a, c: float):
    return jax.tree.map(lambda x: x * np.float32(c), a)


def worker_role(rt: Runtime, worker: Worker, server: GbaServer):
    """Alg. 1's computation thread: take, pull, compute, push (non-blocking), repeat.

    A worker whose process died (``--backend ray``: `WorkerLost`) tells the PS, whose gates
    stop waiting for it (`GbaServer.lose`), and ends; its entry's token never returns. (Run in
    its worker's Ray actor, the role dies with the process; the placement tells the PS.)"""
    p, wid = server.p, worker.wid
    dense_bytes = rt.dense_bytes
    it = 0
    while True:
        # The gate of the mode; a Wait that already holds still costs one event, so workers
        # finishing at the same instant all push before any of them pulls again.
        # (a method bound to its argument: PS0's own process can check it, `ray_wire`)
        yield Wait(server.signal, functools.partial(server.may_start, wid))
        try:
            item = worker.take()
            if item is not None:
                index = item[0]
                params, version = server.pull(wid)
                g_params, (rows, sums), work = worker.compute(params, item, it, coalesce=True)
        except WorkerLost:
            server.lose(wid)
            raise
        if item is None:
            server.leave(wid)
            return
        yield dataclasses.replace(
            work, transfers=work.transfers + ((rt.dense_link, 2 * dense_bytes),))
        # on the virtual clock the gradients are computed now, batched with every other
        # worker's pending computation (runtime/batched.py); elsewhere they are values already
        server.push(Grad(wid, index, index // p.m, version, resolve(g_params), rows, resolve(sums)))
        worker.counters.iterations += 1
        it += 1


def run(cfg: Config) -> dict:
    """``--algo gba``: train, evaluate, return (and write) the summary."""
    p = plan(cfg)
    return intervals.run(cfg, p.workers, interval, batch_size=p.local_batch)


def interval(rt: Runtime) -> dict:
    """One checkpoint interval of the run (`intervals.run`); its `Runtime.finish`."""
    cfg = rt.cfg
    p = plan(cfg)
    s0 = rt.init_state
    local, rows = rt.warm_batch
    _, g, sums = jax.device_get(rt.grads_rows(s0.params, rt.ps.pull(rows, admit=False), local))
    # PS0, where the placement puts the servers the roles share: the object itself, or (Ray)
    # a proxy of it in a process of its own, which the workers' gradients reach by reference
    server = rt.placement.host(GbaServer, hosted_server, cfg, p, s0.params, s0.opt_state,
                               server_context(rt), (g, rows, sums), dense_grads=True,
                               local={"p": p, "signal": Signal("gba-ps")},
                               mutating=("push", "leave", "lose", "restore", "flush"),
                               by_ref={"pull": 2})
    supply = rt.shared_list(p.m, index=server)
    workers = [rt.placement.worker(w, supply) for w in range(p.workers)]
    roles = [RoleSpec(f"gba-worker{w.wid}",
                      rt.placement.run_role(worker_role, w, server, lost=server.lose))
             for w in workers]

    def snapshot():
        return server.params, server.opt_state, rt.start_step + server.accounted // p.m

    def iterations() -> list[int]:
        return [w.counters.iterations for w in workers]

    rt.counts = lambda: additive(server.counters(1.0, iterations()), iterations())
    sched = rt.execute(roles, supply, workers=workers, snapshot=snapshot, counters=server.record,
                       step=lambda: rt.start_step + server.accounted // p.m)
    server.flush()
    extra = whole_run(rt, p.local_batch, server.counters(sched.seconds, iterations()),
                      iterations(), sched.seconds)
    return rt.finish(server.params, server.opt_state, sched, workers, extra,
                     step=rt.total_steps)


def server_context(rt: Runtime) -> types.SimpleNamespace:
    """What `GbaServer` reads of the engine, as values (sent to PS0's process under Ray)."""
    return types.SimpleNamespace(
        cfg=rt.cfg, start_step=rt.start_step, total_steps=rt.total_steps,
        model=types.SimpleNamespace(layout=rt.model.layout),
        ps=rt.ps, batch_size=rt.batch_size, max_len=rt.max_len)


def hosted_server(cfg: Config, p: Plan, params, opt_state, ctx, warm) -> GbaServer:
    """PS0 built where the placement hosts it (in an actor of its own under ``--backend ray``):
    the dense optimizer rebuilt from the config, the embedding PS reached through `ctx`
    (under Ray, through the shards' actor handles)."""
    ctx.dense_apply = jax.jit(functools.partial(apply_dense, make_dense_tx(cfg.dense)))
    server = GbaServer(ctx, p, params, opt_state)
    server_warm(server, warm)
    return server


def server_warm(server: GbaServer, warm: tuple) -> None:
    """Compile the update's shapes (dense apply, the aggregated row push) before threads start.

    Args:
      warm: ``(dense grads, rows, summed row grads)`` of one batch (the engine's warm batch).
    """
    rt = server.rt
    g, rows, sums = warm
    saved = rt.ps.snapshot()
    step0 = [sh.step if sh.tables else 0 for sh in rt.ps.shards]
    n = server.p.aggregate  # the shapes of a full update (a buffer of one takes a fast path)
    server._apply_rows(Update((Grad(0, 0, 0, 0, g, rows, sums),) * n, (True,) * n, n,
                              per_id(server.rule, server.gc)))
    jax.block_until_ready(rt.dense_apply(server.params, server.opt_state, g))
    rt.ps.restore(*saved)  # undo the probe: tables, slots, optimizer steps, tags, counters
    for sh, st in zip(rt.ps.shards, step0):
        if sh.tables:
            sh.step = st
    server.tag.reset()
    server.stats = Stats()
