"""Persia: hybrid training, embeddings asynchronous and the dense network synchronous.

Lian et al., "Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to
100 Trillion Parameters", KDD 2022 (Alg. 1-2, Sec. 4.1-4.2, Sec. 5 Eq. 2-6). Roles, as in
Fig. 4, all on the host-async engine (``algorithms/runtime``):

* the *data loader* is the run's shared data list (`Runtime.shared_list`): global batch i
  (``train.batch_size`` rows) goes to whichever embedding worker asks first (step 1);
* *embedding workers* (Alg. 1), each two roles: the forward role localizes the batch's ids,
  pulls the touched rows from the embedding PS, pools them into activations and sends every NN
  worker its slice (steps 3-4); the backward role waits for the activation gradients of every
  slice, turns them into row gradients and puts them to the PS, which applies the run's
  sparse optimizer (step 7). Nothing locks: a lookup may read rows that other batches'
  updates have not reached yet;
* *NN workers* (Alg. 2): each takes its slice of batch i (``batch_size / nn_workers`` rows),
  runs forward/backward, sends the activation gradients back (step 6) and all-reduces the
  dense gradient with the other NN workers (a `Collective`: every NN worker applies the same
  mean gradient, Alg. 2's "sync gradients");
* the *embedding PS* shards are the run's `EmbeddingPS` (fixed tables or the LRU store).

Staleness (Sec. 5, Eq. 5: ``t - D(t) <= tau``, "the number of samples whose embeddings are
retrieved but their gradients are not yet updated"): a lookup of a global batch may start only
while at most ``tau`` = ``--persia.staleness`` batches are looked up and not yet applied, and
updates are applied in step order, so Eq. 5 holds per batch. The public code (PersiaML/PERSIA
``forward.rs`` / ``backward.rs``) keeps one semaphore per NN worker, released when the gradient
call returns, with backward tasks running concurrently; our single count over the global
batches matches it only for one NN worker (its ``embedding_staleness=1`` is our ``tau=0``). The
issue text says "fewer than tau outstanding", which would make tau=0 deadlock, so we count the
batch being looked up as not outstanding (docs/persia.md). ``tau = 0`` is synchronous training on
the same global batch (tests/test_persia.py).

Modes (``--persia.mode``), the three columns of Table 2 on one set of roles:
``hybrid`` (the above), ``sync`` (tau forced to 0: lookup, dense step and embedding update in
sequence, Fig. 3 top row), ``async`` (embeddings as hybrid; the dense gradients go to an
asynchronous dense PS, `ps.DensePS`, instead of the all-reduce, Fig. 3 second row).

Compression (Sec. 4.2.3, ``--persia.compress``): ``ids`` sends the batch's ID features from the
loader to the embedding worker as unique ids plus uint16 (sample, position) indices; ``fp16``
sends activations and their gradients (embedding <-> NN workers) as fp16 blocks scaled by
``kappa / |v|_inf`` (`runtime.codec`). Both are applied for real (the decoded values train).

Recovery (Sec. 4.2.4): the embedding PS shards and the dense model are snapshotted in memory
every ``persia.snapshot_every`` global steps. ``--persia.fail_ps_at=s`` wipes shard 0 after the
s-th embedding update and restores it from its last snapshot (the updates in between are
lost, counted); ``--persia.fail_nn_at=s`` fails NN worker 0 in step s: its gradient never
arrives, and every NN worker reloads the last dense snapshot and goes on with the next batch
(the paper: "all the GPU instances will abandon their local copy of the model, load the latest
checkpoint, and continue").

    python scripts/train.py --algo persia --persia.staleness 4 --persia.compress both
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.runtime import (
    Collective,
    Link,
    Rendezvous,
    RoleSpec,
    Runtime,
    Signal,
    Wait,
    Work,
    Worker,
    histogram_summary,
    intervals,
    stragglers,
)
from algorithms.runtime.codec import Codec
from algorithms.runtime.ps import DensePS, localize
from recjax.config import Config
from recjax.embeddings import lookup, row_gradients
from recjax.train.contract import add_counts
from recjax.train.step import apply_dense, loss_and_grads, step_metrics


@dataclasses.dataclass(frozen=True)
class ModeRule:
    """One ``--persia.mode`` (a row of `MODES`; the roles read the row, never the name).

    Attributes:
      bounded: embeddings are looked up up to ``tau = persia.staleness`` batches ahead of their
        updates; False forces ``tau = 0`` (lookup, dense step, update in sequence).
      dense_ps: the dense gradients go to an asynchronous dense PS instead of the all-reduce.
    """

    bounded: bool = True
    dense_ps: bool = False


# Table 2's columns (module docstring); the keys are config_async.PERSIA_MODES.
MODES: dict[str, ModeRule] = {
    "hybrid": ModeRule(),
    "sync": ModeRule(bounded=False),
    "async": ModeRule(dense_ps=True),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The resolved sizes of a Persia run.

    Attributes:
      mode: hybrid | sync | async.
      nn_workers: K.
      embedding_workers: E.
      local_batch: rows per NN worker per step (global batch / K).
      tau: the staleness bound in force (0 in sync mode).
    """

    mode: str
    nn_workers: int
    embedding_workers: int
    local_batch: int
    tau: int


def plan(cfg: Config) -> Plan:
    """Resolve the sizes of `cfg`.

    Raises:
      ValueError: a global batch that does not split evenly over the NN workers.
    """
    pc, g = cfg.persia, cfg.train.batch_size
    if g % pc.nn_workers:
        raise ValueError(f"persia: train.batch_size={g} (the global batch) does not split into "
                         f"persia.nn_workers={pc.nn_workers} equal slices; use a multiple")
    tau = pc.staleness if MODES[pc.mode].bounded else 0
    return Plan(pc.mode, pc.nn_workers, pc.embedding_workers, g // pc.nn_workers, tau)


class Ledger:
    """Bytes per role pair, raw and as sent (thread-safe: roles of any thread add to it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.raw: collections.Counter = collections.Counter()
        self.wire: collections.Counter = collections.Counter()

    def add(self, pair: str, raw: int, wire: int | None = None) -> None:
        with self._lock:
            self.raw[pair] += int(raw)
            self.wire[pair] += int(raw if wire is None else wire)

    def summary(self) -> dict:
        return {pair: {"raw": self.raw[pair], "sent": self.wire[pair]} for pair in sorted(self.raw)}


class Pipeline:
    """What the roles share: the staleness permits, the message boxes and the counters.

    Every write is followed by ``signal.notify()`` (the engine's `Wait` re-checks then).
    """

    def __init__(self, p: Plan):
        self.p = p
        self.signal = Signal("persia")
        self._lock = threading.Lock()
        self.looked_up = 0  # global batches whose lookup started (this segment)
        self.applied = 0  # embedding updates applied (this segment)
        self.acts: dict[int, list] = {}  # step -> per NN worker message (None once taken)
        self.batches: dict[int, Any] = {}  # step -> the batch as read (dense, labels)
        self.grads: dict[int, dict[int, Any]] = {}  # step -> NN worker -> gradient message
        self.staleness: collections.Counter = collections.Counter()

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

    def post_acts(self, step: int, batch: Any, messages: list) -> None:
        with self._lock:
            self.batches[step] = batch
            self.acts[step] = messages
        self.signal.notify()

    def has_acts(self, step: int, k: int) -> bool:
        return step in self.acts and self.acts[step][k] is not None

    def take_acts(self, step: int, k: int) -> tuple[Any, Any]:
        with self._lock:
            msg, self.acts[step][k] = self.acts[step][k], None
            batch = self.batches[step]
            if all(m is None for m in self.acts[step]):
                del self.acts[step], self.batches[step]
            return msg, batch

    def post_grads(self, step: int, k: int, message: Any) -> None:
        with self._lock:
            self.grads.setdefault(step, {})[k] = message
        self.signal.notify()

    def has_grads(self, step: int) -> bool:
        return len(self.grads.get(step, ())) == self.p.nn_workers

    def take_grads(self, step: int) -> list:
        with self._lock:
            box = self.grads.pop(step)
        return [box[k] for k in range(self.p.nn_workers)]

    def applied_one(self, looked_up_at: int) -> int:
        """Count one applied update; returns its staleness (updates applied since its lookup)."""
        with self._lock:
            stale = self.applied - looked_up_at
            self.staleness[stale] += 1
            self.applied += 1
        self.signal.notify()
        return stale


class DenseGroup:
    """The NN workers' dense replica and its all-reduce (Alg. 2: sync gradients, update).

    The reduction runs once per step (by the last party to arrive, or by the virtual clock):
    the mean gradient in party order, one optimizer step; every party receives the new
    params, so the K replicas stay identical. Failure injection and the dense snapshots live
    here because they are decided at the all-reduce.
    """

    def __init__(self, rt: Runtime, p: Plan, params: Any, opt_state: Any):
        self.rt, self.p = rt, p
        self.params, self.opt_state = params, opt_state
        self.steps = 0  # dense steps applied in this segment
        self.every = rt.cfg.persia.snapshot_every
        self.snapshot = (params, opt_state, 0)  # (params, opt_state, dense steps at the time)
        self.recoveries = 0
        self.steps_lost = 0
        self.group = Rendezvous(p.nn_workers, self._reduce)
        tx = rt.tx

        def mean_apply(params, opt_state, grads):  # one jitted call inside the rendezvous
            total = grads[0]
            for g in grads[1:]:
                total = jax.tree.map(jnp.add, total, g)
            mean = total if len(grads) == 1 else jax.tree.map(
                lambda x: x * np.float32(1.0 / len(grads)), total)
            return apply_dense(tx, params, opt_state, mean)

        self.mean_apply = jax.jit(mean_apply)

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


FAILED = object()  # the gradient of an NN worker that failed in this step


class PsRecovery:
    """In-memory snapshots of the embedding PS shards and the injected shard failure."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.every = rt.cfg.persia.snapshot_every
        self.fail_at = rt.cfg.persia.fail_ps_at
        self.snaps = [(sh.snapshot(), rt.start_step) for sh in rt.ps.shards]
        self.recoveries = 0
        self.updates_lost = 0

    def after_update(self, applied: int) -> None:
        """Called after the `applied`-th embedding update of the run (global steps)."""
        if self.every and applied % self.every == 0:
            self.snaps = [(sh.snapshot(), applied) for sh in self.rt.ps.shards]
        if self.fail_at and applied == self.fail_at:
            shard = self.rt.ps.shards[0]
            shard.wipe()  # the process died: its rows are gone
            snap, at = self.snaps[0]
            shard.restore(snap)  # restarted from its last snapshot
            self.recoveries += 1
            self.updates_lost += applied - at


class Persia:
    """One Persia run: the engine, the jitted pieces of each role, the shared pipeline."""

    def __init__(self, rt: Runtime):
        self.cfg, self.p = cfg, p = rt.cfg, plan(rt.cfg)
        self.rt = rt
        self.codec = Codec(cfg.persia.compress, cfg.persia.kappa)
        self.pipe = Pipeline(p)
        self.ledger = Ledger()
        s0 = rt.init_state
        self.dense = DenseGroup(rt, p, s0.params, s0.opt_state)
        self.dense_ps = (DensePS(s0.params, s0.opt_state, rt.dense_apply)
                         if MODES[p.mode].dense_ps else None)
        self.recovery = PsRecovery(rt)
        self.emb_stragglers = stragglers.parse(cfg.persia.embedding_stragglers,
                                               p.embedding_workers, cfg.train.seed + 1)
        bw = cfg.runtime.bandwidth_gbps * 1e9 / 8
        self.nn_link = Link("emb-nn", bw)
        self.id_cost = cfg.persia.embedding_cost_us * 1e-6
        spec = rt.data.spec
        self.ids_per_batch = cfg.train.batch_size * spec.n_fields * spec.max_len
        # ring all-reduce: each party sends and receives 2 (K-1)/K of the dense bytes
        k = p.nn_workers
        self.allreduce_bytes = int(2 * (k - 1) / k * rt.dense_bytes) if k > 1 else 0
        self.allreduce_seconds = self.allreduce_bytes / rt.bandwidth
        self.allreduce_wall = [0.0] * k
        mini = rt.mini_layout
        # NN worker k's forward/backward, where the placement runs worker group k's compute
        # (a jitted function here, or in the group's process under --backend ray)
        self.nn_grads = [rt.placement.remote_fn(j, "nn_grads", nn_grads_fn, k) for j in range(k)]
        self.emb_lookup = jax.jit(lambda minis, ids, mask: lookup(mini, minis, ids, mask))
        self.row_grads = jax.jit(lambda g_acts, ids, mask: row_gradients(mini, g_acts, ids, mask))
        self._warm()

    def _warm(self) -> None:
        """Compile every jitted piece before a thread starts (PERF_NOTES 5)."""
        rt = self.rt
        local, rows = rt.warm_batch  # the engine's: a global batch, localized
        acts = self.emb_lookup(rt.ps.pull(rows, admit=False), local.ids, local.mask)
        sl = self._slice(acts, local, 0)
        for fn in self.nn_grads:  # under Ray, each NN worker's process compiles its own
            _, g_params, g = fn(self.dense.params, *sl)
        jax.block_until_ready(self.dense.mean_apply(self.dense.params, self.dense.opt_state,
                                                    [g_params] * self.p.nn_workers))
        jax.block_until_ready(self.row_grads({k: jnp.concatenate([v] * self.p.nn_workers)
                                              for k, v in g.items()}, local.ids, local.mask))

    def _slice(self, acts: dict, batch: Any, k: int) -> tuple:
        b = self.p.local_batch
        part = slice(k * b, (k + 1) * b)
        return ({g: a[part] for g, a in acts.items()}, batch.dense[part], batch.label[part])

    # -- roles ------------------------------------------------------------------------------
    def embedding_forward(self, e: int, supply, queue: collections.deque, done: list):
        """Alg. 1, forward task: take a batch (with a permit), look it up, send the slices."""
        rt, pipe, codec, p = self.rt, self.pipe, self.codec, self.p
        it = 0
        while True:
            while True:
                yield Wait(pipe.signal, pipe.may_look_up)
                if pipe.acquire():
                    break
            item = supply.take(e)
            if item is None:
                pipe.release_unused()
                done[e] = True
                pipe.signal.notify()
                return
            step, batch = item
            msg, raw, wire = codec.send_ids(batch.ids)
            self.ledger.add("loader->embedding", raw, wire)
            ids = codec.recv_ids(msg)
            local, rows = localize(rt.model.layout, batch._replace(ids=ids))
            minis = rt.ps.pull(rows)
            version = pipe.applied
            acts = self.emb_lookup(minis, local.ids, local.mask)
            nbytes = rt.ps.shard_bytes(rows)
            for s, b in enumerate(nbytes):
                self.ledger.add(f"ps{s}<->embedding", b)
            messages = []
            sent = 0
            for k in range(p.nn_workers):
                part = {}
                for g, a in self._slice(acts, batch, k)[0].items():
                    m, raw, wire = codec.send_values(np.asarray(a))
                    self.ledger.add("embedding->nn", raw, wire)
                    sent += wire
                    part[g] = m
                messages.append(part)
            transfers = tuple((link, b // 2) for link, b in zip(rt.shard_links, nbytes) if b)
            yield Work(self.id_cost * self.ids_per_batch, self.emb_stragglers.factor(e, it),
                       transfers + ((self.nn_link, sent),))
            queue.append((step, local, rows, version))
            pipe.post_acts(step, batch, messages)
            it += 1

    def embedding_backward(self, e: int, queue: collections.deque, done: list):
        """Alg. 1, backward task: gather the slices' gradients, put row gradients to the PS."""
        rt, pipe, codec = self.rt, self.pipe, self.codec
        it = 0
        while True:
            yield Wait(pipe.signal, lambda: bool(queue) or done[e])
            if not queue:
                return
            step, local, rows, version = queue[0]
            # updates apply in step order, so the staleness of Eq. 5 (updates applied between
            # a batch's lookup and its own update) is at most the tau batches outstanding at its
            # lookup; out of order, a slow backward role would see any number pass it
            yield Wait(pipe.signal, lambda step=step: pipe.has_grads(step)
                       and pipe.applied == step - rt.start_step)
            queue.popleft()
            parts = pipe.take_grads(step)
            g_acts = {g: jnp.concatenate([codec.recv_values(part[g]) for part in parts])
                      for g in parts[0]}
            row_g = self.row_grads(g_acts, local.ids, local.mask)
            nbytes = rt.ps.shard_bytes(rows)
            transfers = tuple((link, b // 2) for link, b in zip(rt.shard_links, nbytes) if b)
            yield Work(self.id_cost * self.ids_per_batch, self.emb_stragglers.factor(e, it),
                       transfers)
            rt.ps.push(rows, row_g)
            pipe.applied_one(version)
            self.recovery.after_update(rt.start_step + pipe.applied)
            it += 1

    def nn_worker(self, k: int, worker: Worker):
        """Alg. 2 on slice k of every global batch, in order."""
        rt, pipe, codec, p = self.rt, self.pipe, self.codec, self.p
        params = self.dense.params
        version = 0
        fail_at = self.cfg.persia.fail_nn_at
        for step in range(rt.start_step, rt.total_steps):
            yield Wait(pipe.signal, lambda step=step: pipe.has_acts(step, k))
            msg, batch = pipe.take_acts(step, k)
            acts = {g: codec.recv_values(m) for g, m in msg.items()}
            _, dense, label = self._slice({}, batch, k)
            if self.dense_ps is not None:
                params, version = self.dense_ps.pull()
            # a straggler's slowdown scales its forward/backward as timed where it ran
            # (`clock.Work.measured`), not the activations' round trip under Ray
            factor = rt.stragglers.factor(k, step)
            fn, secs = self.nn_grads[k], None
            if factor > 1:
                (m, g_params, g_acts), secs = fn.timed(params, acts, dense, label)
            else:
                m, g_params, g_acts = fn(params, acts, dense, label)
            worker.counters.metrics.append(m)
            worker.counters.indices.append(step)
            out, sent = {}, 0
            for g, a in g_acts.items():
                out[g], raw, wire = codec.send_values(np.asarray(a))
                self.ledger.add("nn->embedding", raw, wire)
                sent += wire
            yield Work(rt.example_cost * p.local_batch, factor, ((self.nn_link, sent),),
                       measured=secs)
            pipe.post_grads(step, k, out)
            if self.dense_ps is not None:
                self.ledger.add("nn<->dense-ps", 2 * rt.dense_bytes)
                self.dense_ps.push(g_params, version)
            else:
                failed = k == 0 and step + 1 == fail_at
                self.ledger.add("nn<->nn (all-reduce)", self.allreduce_bytes)
                t0 = time.perf_counter()
                params = yield Collective(self.dense.group, k, FAILED if failed else g_params,
                                          self.allreduce_seconds)
                self.allreduce_wall[k] += time.perf_counter() - t0
            worker.counters.iterations += 1

    # -- the run ----------------------------------------------------------------------------
    def params(self) -> tuple[Any, Any]:
        if self.dense_ps is not None:
            return self.dense_ps.snapshot()
        return self.dense.params, self.dense.opt_state

    def run(self) -> dict:
        rt, p = self.rt, self.p
        supply = rt.shared_list(1, localize=False)
        workers = [rt.placement.worker(k, supply) for k in range(p.nn_workers)]
        queues = [collections.deque() for _ in range(p.embedding_workers)]
        done = [False] * p.embedding_workers
        roles = [RoleSpec(f"persia-nn{w.wid}", self.nn_worker(w.wid, w)) for w in workers]
        for e in range(p.embedding_workers):
            roles.append(RoleSpec(f"persia-emb{e}-fwd",
                                  self.embedding_forward(e, supply, queues[e], done)))
            roles.append(RoleSpec(f"persia-emb{e}-bwd",
                                  self.embedding_backward(e, queues[e], done)))

        def snapshot():
            params, opt_state = self.params()
            return params, opt_state, rt.start_step + min(w.counters.iterations for w in workers)

        def live() -> dict:  # counters over time (metrics.jsonl `counters` records)
            return {"embedding_staleness": histogram_summary(dict(self.pipe.staleness)),
                    "embedding_updates": self.pipe.applied, "bytes": self.ledger.summary(),
                    "nn_recoveries": self.dense.recoveries,
                    "ps_recoveries": self.recovery.recoveries}

        def served() -> list[int]:  # the embedding workers reach the PS, the NN workers never
            return [self.ledger.raw[f"ps{s}<->embedding"] for s in range(rt.ps.num_shards)]

        rt.counts = self.additive
        sched = rt.execute(roles, supply, workers=workers, snapshot=snapshot, counters=live,
                           step=lambda: rt.start_step + min(w.counters.iterations
                                                            for w in workers), served=served)
        extra = self.counters(sched)
        params, opt_state = self.params()
        return rt.finish(params, opt_state, sched, workers, extra, step=rt.total_steps)

    def _allreduce(self, steps: int) -> float:
        """Seconds the NN workers' dense all-reduce took over `steps` steps of this call."""
        if self.dense_ps is not None:
            return 0.0
        if self.cfg.train.deterministic:
            return self.allreduce_seconds * steps
        return sum(self.allreduce_wall) / self.p.nn_workers

    def additive(self) -> dict:
        """This call's counters that add up over a run's intervals and resumes
        (`contract.add_counts`; `Runtime.counts`)."""
        pipe, rec = self.pipe, self.recovery
        out = {"embedding_staleness": {str(k): v for k, v in pipe.staleness.items()},
               "embedding_updates": pipe.applied, "steps": pipe.applied,
               "bytes_raw": dict(self.ledger.raw), "bytes_sent": dict(self.ledger.wire),
               "ps_recoveries": rec.recoveries, "ps_updates_lost": rec.updates_lost,
               "nn_recoveries": self.dense.recoveries, "dense_steps_lost": self.dense.steps_lost,
               "dense_allreduce_seconds": self._allreduce(pipe.applied)}
        if self.dense_ps is not None:
            out["dense_staleness"] = {str(k): v for k, v in self.dense_ps.staleness.items()}
        return out

    def counters(self, sched) -> dict:
        """The summary's counters of the whole run: this call's, added to those of the
        checkpoint it started from (a fresh run's are its own)."""
        out = self._counters()
        base = self.rt.base_counts
        if not base:
            return out
        tot = add_counts(base, self.additive())
        hist = {k: histogram_summary({int(b): n for b, n in tot[k].items()})
                for k in ("embedding_staleness", "dense_staleness") if k in tot}
        return {**out, **hist, **{k: tot[k] for k in (
            "embedding_updates", "ps_recoveries", "ps_updates_lost", "nn_recoveries",
            "dense_steps_lost", "dense_allreduce_seconds")},
            "dense_allreduce_seconds_per_step": tot["dense_allreduce_seconds"]
            / max(tot["steps"], 1),
            "bytes": {pair: {"raw": tot["bytes_raw"][pair], "sent": tot["bytes_sent"][pair]}
                      for pair in sorted(tot["bytes_raw"])}}

    def _counters(self) -> dict:
        p, pipe = self.p, self.pipe
        steps = self.rt.total_steps - self.rt.start_step
        allreduce = self._allreduce(steps)
        out = {
            "persia_mode": p.mode, "persia_nn_workers": p.nn_workers,
            "persia_embedding_workers": p.embedding_workers,
            "persia_local_batch_size": p.local_batch, "persia_staleness_bound": p.tau,
            "persia_compress": self.codec.kind,
            "embedding_staleness": histogram_summary(dict(pipe.staleness)),
            "embedding_updates": pipe.applied,
            "dense_allreduce_seconds": allreduce,
            "dense_allreduce_seconds_per_step": allreduce / max(steps, 1),
            "bytes": self.ledger.summary(),
            "ps_recoveries": self.recovery.recoveries,
            "ps_updates_lost": self.recovery.updates_lost,
            "nn_recoveries": self.dense.recoveries,
            "dense_steps_lost": self.dense.steps_lost,
        }
        if self.dense_ps is not None:
            hist = dict(sorted(self.dense_ps.staleness.items()))
            out["dense_staleness"] = histogram_summary(hist)
        return out


def nn_grads_fn(rt, k: int):
    """An NN worker's forward/backward on its slice (Alg. 2), for `placement.remote_fn`: ``(params,
    acts, dense, label) -> (metrics, dense grads, activation grads)`` of one of `k` slices."""
    model, scale = rt.mini_model, np.float32(1.0 / k)

    def nn_grads(params, acts, dense, label):
        (loss, logits), (g_params, g_acts) = loss_and_grads(model, params, acts, _Batch(dense, label))
        # each slice's loss is its own mean: 1/K of it is its share of the global mean
        return (step_metrics(loss, logits, label), g_params,
                {g: a * scale for g, a in g_acts.items()})

    return nn_grads


class _Batch:
    """The dense features and labels of a slice: all `loss_and_grads` reads of a batch."""

    def __init__(self, dense, label):
        self.dense, self.label = dense, label


def run(cfg: Config) -> dict:
    """``--algo persia``: train, evaluate, return (and write) the summary."""
    return intervals.run(cfg, plan(cfg).nn_workers, lambda rt: Persia(rt).run())
