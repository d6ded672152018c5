"""What Persia's roles share (``persia.py`` tells the whole): the staleness pipeline, the NN
workers' dense all-reduce, the embedding PS's in-memory recovery, and the bytes each role
sent. Each is an object of the run's placement (``algorithms/runtime/placement.py``): here the
object itself; with the roles in their Ray actors the pipeline and the dense group are hosted
in actors of their own (``placement.host``), which the roles call and wait on, and a `Ledger`
lives beside each worker group's roles (``placement.beside``)."""

from __future__ import annotations

import collections
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.runtime import Signal
from algorithms.runtime.collectives import Collectives
from algorithms.runtime.supply import EntryIndex
from recjax.train.setup import make_dense_tx
from recjax.train.step import apply_dense


class Ledger:
    """Bytes per role pair, raw and as sent, and the seconds an NN worker spent in the dense
    all-reduce: one per worker group (its roles add to it; any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.raw: collections.Counter = collections.Counter()
        self.wire: collections.Counter = collections.Counter()
        self.waited = 0.0

    def add(self, pair: str, raw: int, wire: int | None = None) -> None:
        with self._lock:
            self.raw[pair] += int(raw)
            self.wire[pair] += int(raw if wire is None else wire)

    def wait(self, seconds: float) -> None:
        with self._lock:
            self.waited += seconds

    def totals(self) -> tuple[dict, dict, float]:
        """``(raw, sent, all-reduce seconds)``, one read (a call, where it lives elsewhere)."""
        with self._lock:
            return dict(self.raw), dict(self.wire), self.waited


def totals(ledgers: list) -> tuple[collections.Counter, collections.Counter, float]:
    """The ledgers' bytes per pair (raw, sent) and all-reduce seconds, added up."""
    raw, wire, waited = collections.Counter(), collections.Counter(), 0.0
    for ledger in ledgers:
        r, w, s = ledger.totals()
        raw.update(r)
        wire.update(w)
        waited += s
    return raw, wire, waited


class PsRecovery:
    """In-memory snapshots of the embedding PS shards and the injected shard failure
    (Sec. 4.2.4; ``--persia.fail_ps_at``). The snapshots are read only to restore the shard
    that fails, so they are taken only when a failure is injected (`ps` None: none)."""

    def __init__(self, ps, every: int, fail_at: int, start_step: int):
        self.ps, self.every, self.fail_at = ps, every, fail_at
        self.snaps = [(sh.snapshot(), start_step) for sh in ps.shards] if fail_at else []
        self.recoveries = 0
        self.updates_lost = 0

    def after_update(self, applied: int) -> None:
        """Called after the `applied`-th embedding update of the run (global steps)."""
        if not self.fail_at:
            return
        if self.every and applied % self.every == 0:
            self.snaps = [(sh.snapshot(), applied) for sh in self.ps.shards]
        if applied == self.fail_at:
            shard = self.ps.shards[0]
            shard.wipe()  # the process died: its rows are gone
            snap, at = self.snaps[0]
            shard.restore(snap)  # restarted from its last snapshot
            self.recoveries += 1
            self.updates_lost += applied - at


class Pipeline:
    """What the roles share: the data list's indices, the staleness permits, the message
    boxes and the counters. Every condition a role waits on is a method (`may_look_up`,
    `queued_or_done`, `has_acts`, `may_apply`), and every write is followed by
    ``signal.notify()`` (the engine's `Wait` re-checks then; hosted in an actor, the host
    wakes the roles waiting there after each of these calls).

    Args:
      p: the run's `persia.Plan`.
      start_step, total_steps: this interval's global steps.
      recovery: the PS's `PsRecovery`, told of every update as it is counted.
    """

    def __init__(self, p, start_step: int, total_steps: int, recovery: PsRecovery):
        self.p, self.start, self.recovery = p, start_step, recovery
        self.signal = Signal("persia")
        self._lock = threading.Lock()
        self.entries = EntryIndex(start_step, total_steps)  # one list entry per global step
        self.looked_up = 0  # global batches whose lookup started (this segment)
        self.applied = 0  # embedding updates applied (this segment)
        self.acts: dict[int, list] = {}  # step -> per NN worker message (None once taken)
        self.grads: dict[int, dict[int, Any]] = {}  # step -> NN worker -> gradient message
        self.queued = [0] * p.embedding_workers  # batches each embedding worker looked up
        self.done = [False] * p.embedding_workers  # and not yet applied; its list ran out
        self.staleness: collections.Counter = collections.Counter()

    def next_entry(self) -> int | None:
        """The data list's next entry (`supply.EntryIndex`), where the workers read it."""
        return self.entries.next_entry()

    def may_look_up(self) -> bool:
        return self.looked_up - self.applied <= self.p.tau

    def acquire(self) -> bool:
        """Take a lookup permit if one is free (the semaphore of the public code)."""
        with self._lock:
            if self.looked_up - self.applied <= self.p.tau:
                self.looked_up += 1
                return True
            return False

    def release_unused(self) -> None:
        with self._lock:
            self.looked_up -= 1
        self.signal.notify()

    def finish(self, e: int) -> None:
        """Embedding worker `e` found the list empty."""
        self.done[e] = True
        self.signal.notify()

    def queued_or_done(self, e: int) -> bool:
        return self.queued[e] > 0 or self.done[e]

    def post_acts(self, step: int, e: int, messages: list) -> None:
        """Embedding worker `e`'s activations of `step`: one message per NN worker."""
        with self._lock:
            self.acts[step] = messages
            self.queued[e] += 1
        self.signal.notify()

    def has_acts(self, step: int, k: int) -> bool:
        return step in self.acts and self.acts[step][k] is not None

    def take_acts(self, step: int, k: int) -> Any:
        with self._lock:
            msg, self.acts[step][k] = self.acts[step][k], None
            if all(m is None for m in self.acts[step]):
                del self.acts[step]
            return msg

    def post_grads(self, step: int, k: int, message: Any) -> None:
        with self._lock:
            self.grads.setdefault(step, {})[k] = message
        self.signal.notify()

    def has_grads(self, step: int) -> bool:
        return len(self.grads.get(step, ())) == self.p.nn_workers

    def may_apply(self, step: int) -> bool:
        """Whether `step`'s gradients are in and every earlier step's update applied."""
        return self.has_grads(step) and self.applied == step - self.start

    def take_grads(self, step: int, e: int) -> list:
        with self._lock:
            box = self.grads.pop(step)
            self.queued[e] -= 1
        return [box[k] for k in range(self.p.nn_workers)]

    def record(self) -> dict:
        """The counts the run reports, one read: staleness histogram, updates applied, the
        PS's recoveries and the updates they lost."""
        with self._lock:
            return {"staleness": dict(self.staleness), "applied": self.applied,
                    "ps_recoveries": self.recovery.recoveries,
                    "ps_updates_lost": self.recovery.updates_lost}

    def applied_one(self, looked_up_at: int) -> int:
        """Count one applied update (its PS recovery's turn comes before anyone sees it);
        returns its staleness (updates applied since its lookup)."""
        with self._lock:
            stale = self.applied - looked_up_at
            self.staleness[stale] += 1
            self.applied += 1
            self.recovery.after_update(self.start + self.applied)
        self.signal.notify()
        return stale


class _Failed:
    """The gradient of an NN worker that failed in this step (`FAILED`, one object in every
    process: it is pickled by name)."""

    def __reduce__(self):
        return "FAILED"

    def __repr__(self) -> str:
        return "FAILED"


FAILED = _Failed()


class DenseGroup:
    """The NN workers' dense replica and its all-reduce (Alg. 2: sync gradients, update).

    The reduction runs once per step (by the last party to arrive, or by the virtual clock):
    the mean gradient in party order, one optimizer step; every party receives the new
    params, so the K replicas stay identical. Failure injection and the dense snapshots live
    here because they are decided at the all-reduce. Its one group (`Collectives`' calls:
    ``groups``, ``join``, ``close``) is what the NN workers' roles join
    (``placement.parties``).

    Args:
      cfg: the run's config (the dense optimizer, ``persia.snapshot_every``).
      n: the NN workers.
      params, opt_state: the dense state to continue from.
      like: an NN worker's dense gradient: the update compiled on it before the clock runs.
    """

    def __init__(self, cfg, n: int, params: Any, opt_state: Any, like: Any = None):
        self.params, self.opt_state = params, opt_state
        self.steps = 0  # dense steps applied in this segment
        self.every = cfg.persia.snapshot_every
        self.snapshot = (params, opt_state, 0)  # (params, opt_state, dense steps at the time)
        self.recoveries = 0
        self.steps_lost = 0
        tx = make_dense_tx(cfg.dense)

        def mean_apply(params, opt_state, grads):  # one jitted call inside the rendezvous
            total = grads[0]
            for g in grads[1:]:
                total = jax.tree.map(jnp.add, total, g)
            mean = total if len(grads) == 1 else jax.tree.map(
                lambda x: x * np.float32(1.0 / len(grads)), total)
            return apply_dense(tx, params, opt_state, mean)

        self.mean_apply = jax.jit(mean_apply)
        if like is not None:
            jax.block_until_ready(self.mean_apply(params, opt_state, [like] * n))
        self._parties = Collectives(1, n, self._reduce)
        self.groups = self._parties.groups

    def join(self, k: int, index: int, value) -> tuple[bool, Any]:
        return self._parties.join(k, index, value)

    def close(self, k: int) -> None:
        self._parties.close(k)

    def state(self) -> tuple[Any, Any]:
        """``(params, opt_state)`` as of the last step (one read)."""
        return self.params, self.opt_state

    def record(self) -> dict:
        """``recoveries`` (all-reduces that reloaded the snapshot), ``steps_lost``."""
        return {"recoveries": self.recoveries, "steps_lost": self.steps_lost}

    def _reduce(self, grads: list) -> Any:
        if any(g is FAILED for g in grads):  # a worker died: everyone reloads the snapshot
            self.params, self.opt_state, at = self.snapshot
            self.recoveries += 1
            self.steps_lost += self.steps - at
        else:
            self.params, self.opt_state = self.mean_apply(self.params, self.opt_state, grads)
        self.steps += 1
        if self.every and self.steps % self.every == 0:
            self.snapshot = (self.params, self.opt_state, self.steps)
        return self.params


def dense_group(params: Any, opt_state: Any, like: Any, cfg, n: int) -> DenseGroup:
    """`DenseGroup` from its dense trees first (`placement.host_group_blocks`' factory: under
    ``--ray.dense_shards`` each block server gets its block of the three)."""
    return DenseGroup(cfg, n, params, opt_state, like)
