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
every ``persia.snapshot_every`` global steps (the shards only when a failure is injected: the
snapshots are read then only). ``--persia.fail_ps_at=s`` wipes shard 0 after the
s-th embedding update and restores it from its last snapshot (the updates in between are
lost, counted); ``--persia.fail_nn_at=s`` fails NN worker 0 in step s: its gradient never
arrives, and every NN worker reloads the last dense snapshot and goes on with the next batch
(the paper: "all the GPU instances will abandon their local copy of the model, load the latest
checkpoint, and continue").

Where the roles run (``persia_roles.py``; the servers they share, ``persia_servers.py``):
in this process (threads, or the virtual clock), or under ``--backend ray`` with ``--ray.roles
actors`` (the default there) each NN worker's role in its worker actor and each embedding
worker's two roles in one actor of its own, which reads the data list's entries itself and
pulls from and pushes to the PS shards' actors directly; the pipeline and the dense group are
hosted in actors of their own, where the roles' waits wait (docs/distributed.md).

    python scripts/train.py --algo persia --persia.staleness 4 --persia.compress both
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from algorithms.persia_roles import (
    RoleContext,
    embedding_backward,
    embedding_forward,
    lookup_fn,
    nn_grads_fn,
    nn_worker,
    row_grads_fn,
    slice_of,
)
from algorithms.persia_servers import (
    DenseGroup,
    Ledger,
    Pipeline,
    PsRecovery,
    dense_group,
    totals,
)
from algorithms.runtime import (
    Counters,
    Link,
    RoleSpec,
    Runtime,
    Signal,
    histogram_summary,
    intervals,
    stragglers,
)
from algorithms.runtime.codec import Codec
from algorithms.runtime.segments import StateLost
from recjax.config import Config
from recjax.train.contract import add_counts


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


class Persia:
    """One Persia run: the roles' context, their servers and functions, the run and its
    counters (the roles: ``persia_roles.py``; NN worker k is worker group k, embedding worker
    e group K + e)."""

    def __init__(self, rt: Runtime):
        self.cfg, self.p = cfg, p = rt.cfg, plan(rt.cfg)
        self.rt = rt
        self.codec = Codec(cfg.persia.compress, cfg.persia.kappa)
        k, e = p.nn_workers, p.embedding_workers
        spec = rt.data.spec
        # ring all-reduce: each party sends and receives 2 (K-1)/K of the dense bytes
        allreduce_bytes = int(2 * (k - 1) / k * rt.dense_bytes) if k > 1 else 0
        self.allreduce_seconds = allreduce_bytes / rt.bandwidth
        self.ctx = RoleContext(
            p, self.codec, rt.model.layout, rt.start_step, rt.total_steps,
            cfg.persia.fail_nn_at, rt.example_cost, cfg.persia.embedding_cost_us * 1e-6,
            cfg.train.batch_size * spec.n_fields * spec.max_len, allreduce_bytes,
            self.allreduce_seconds, rt.dense_bytes, rt.stragglers,
            stragglers.parse(cfg.persia.embedding_stragglers, e, cfg.train.seed + 1),
            Link("emb-nn", cfg.runtime.bandwidth_gbps * 1e9 / 8))
        place = rt.placement
        # where the placement runs each group's compute: a jitted function here, or in the
        # group's process under --backend ray (the NN workers' even with the roles here)
        self.nn_grads = [place.remote_fn(j, "nn_grads", nn_grads_fn, k) for j in range(k)]
        self.lookups = [place.role_fn(k + j, "persia_lookup", lookup_fn) for j in range(e)]
        self.row_grads_fns = [place.role_fn(k + j, "persia_row_grads", row_grads_fn)
                              for j in range(e)]
        self.emb_lookup, self.row_grads = self.lookups[0], self.row_grads_fns[0]
        s0 = rt.init_state
        like = self._warm(s0.params)
        recovery = PsRecovery(rt.ps if cfg.persia.fail_ps_at else None,
                              cfg.persia.snapshot_every, cfg.persia.fail_ps_at, rt.start_step)
        self.pipe = place.host(Pipeline, Pipeline, p, rt.start_step, rt.total_steps, recovery,
                               near_roles=True, local={"signal": Signal("persia")},
                               mutating=("acquire", "release_unused", "finish", "post_acts",
                                         "take_acts", "post_grads", "take_grads",
                                         "applied_one"))
        # the NN workers' replica and all-reduce: one, or under --ray.dense_shards D one per
        # block of whole leaves (each block's mean and optimizer step are the whole one's for
        # its leaves); in async mode none: the dense PS steps the params
        self.dense_ps, self.dense = None, None
        if MODES[p.mode].dense_ps:
            self.dense_ps = place.dense_ps(s0.params, s0.opt_state)
        else:
            self.dense = place.host_group_blocks(DenseGroup, dense_group,
                                                 (s0.params, s0.opt_state, like), cfg, k,
                                                 joins={"state": (s0.params, s0.opt_state)})
        self.ledgers = [place.beside(g, Ledger, name="persia-ledger") for g in range(k + e)]

    def _warm(self, params) -> Any:
        """Compile every jitted piece before a thread starts (PERF_NOTES 5); returns an NN
        worker's dense gradient (the all-reduce is compiled on it where it runs)."""
        rt, k = self.rt, self.p.nn_workers
        local, rows = rt.warm_batch  # the engine's: a global batch, localized
        minis = rt.ps.pull(rows, admit=False)
        for look_up in self.lookups:  # (under Ray, each embedding worker's process its own)
            acts = look_up(minis, local.ids, local.mask)
        sl = slice_of(acts, local, 0, self.p.local_batch)
        for fn in self.nn_grads:  # under Ray, each NN worker's process compiles its own
            _, g_params, g = fn(params, *sl)
        for row_grads in self.row_grads_fns:
            jax.block_until_ready(row_grads({n: jnp.concatenate([v] * k) for n, v in g.items()},
                                            local.ids, local.mask))
        return jax.device_get(g_params)

    # -- the run ----------------------------------------------------------------------------
    def params(self) -> tuple[Any, Any]:
        if self.dense_ps is not None:
            return self.dense_ps.snapshot()
        return self.dense.state()

    def run(self) -> dict:
        rt, p, ctx, place = self.rt, self.p, self.ctx, self.rt.placement
        k = p.nn_workers
        supply = rt.shared_list(1, localize=False, index=self.pipe)
        workers = [place.worker(j, None) for j in range(k)]
        group = place.parties(self.dense, 1, k)[0] if self.dense is not None else None
        s0 = rt.init_state
        roles = [RoleSpec(f"persia-nn{w.wid}", place.run_role(
            nn_worker, w, ctx, self.pipe, self.dense_ps, self.ledgers[w.wid], group,
            self.nn_grads[w.wid], s0.params, lost=self._lost)) for w in workers]
        for e in range(p.embedding_workers):
            g = k + e
            feeder = place.worker(g, supply, compute=False)
            back = place.companion(g, Counters(), worker=feeder)
            queue = place.beside(g, collections.deque, name="persia-queue")
            roles.append(RoleSpec(f"persia-emb{e}-fwd", place.run_role(
                embedding_forward, feeder, ctx, self.pipe, self.ledgers[g], queue,
                self.lookups[e], e, lost=self._lost)))
            roles.append(RoleSpec(f"persia-emb{e}-bwd", place.run_role(
                embedding_backward, back, ctx, self.pipe, queue, self.row_grads_fns[e], e,
                lost=self._lost)))

        def snapshot():
            params, opt_state = self.params()
            return params, opt_state, rt.start_step + min(w.counters.iterations for w in workers)

        def live() -> dict:  # counters over time (metrics.jsonl `counters` records)
            pipe, dense = self.pipe.record(), self._dense_record()
            raw, wire, _ = totals(self.ledgers)
            return {"embedding_staleness": histogram_summary(pipe["staleness"]),
                    "embedding_updates": pipe["applied"], "bytes": _bytes(raw, wire),
                    "nn_recoveries": dense["recoveries"],
                    "ps_recoveries": pipe["ps_recoveries"]}

        def served() -> list[int]:  # the embedding workers reach the PS, the NN workers never
            raw = totals(self.ledgers)[0]
            return [raw[f"ps{s}<->embedding"] for s in range(rt.ps.num_shards)]

        rt.counts = self.additive
        sched = rt.execute(roles, supply, workers=workers, snapshot=snapshot, counters=live,
                           step=lambda: rt.start_step + min(w.counters.iterations
                                                            for w in workers), served=served)
        extra = self.counters(sched)
        params, opt_state = self.params()
        return rt.finish(params, opt_state, sched, workers, extra, step=rt.total_steps)

    def _lost(self, wid) -> None:
        """A role's process died (its role ran there: ``placement.run_role``). Its batches in
        flight (looked up, or in its NN worker's step) went with it, and every later step
        waits for them: the run stops (the engine names its latest checkpoint), as when a
        process holding state that is not restarted dies (`segments.StateLost`; the threaded run
        has no such death, and an NN worker's compute process under ``--ray.roles driver``
        is restarted by its `RemoteFn`)."""
        raise StateLost(f"persia: the process of worker group {wid} died with its role's "
                        "batches in flight, which every later step of the pipeline waits for")

    def _allreduce(self, steps: int, waited: float) -> float:
        """Seconds the NN workers' dense all-reduce took over `steps` steps of this call
        (`waited`: the NN workers' wall seconds in it, added up)."""
        if self.dense_ps is not None:
            return 0.0
        if self.cfg.train.deterministic:
            return self.allreduce_seconds * steps
        return waited / self.p.nn_workers

    def _dense_record(self) -> dict:
        """The all-reduce's counts (`DenseGroup.record`); none in async mode, which has none."""
        return {"recoveries": 0, "steps_lost": 0} if self.dense is None else self.dense.record()

    def _read(self) -> dict:
        """This call's counts, read once from where they live."""
        raw, wire, waited = totals(self.ledgers)
        out = {**self.pipe.record(), **{f"dense_{n}": v for n, v in self._dense_record().items()},
               "raw": raw, "wire": wire, "waited": waited}
        if self.dense_ps is not None:
            out["dense_staleness"] = dict(sorted(self.dense_ps.staleness.items()))
        return out

    def additive(self) -> dict:
        """This call's counters that add up over a run's intervals and resumes
        (`contract.add_counts`; `Runtime.counts`)."""
        r = self._read()
        out = {"embedding_staleness": {str(k): v for k, v in r["staleness"].items()},
               "embedding_updates": r["applied"], "steps": r["applied"],
               "bytes_raw": dict(r["raw"]), "bytes_sent": dict(r["wire"]),
               "ps_recoveries": r["ps_recoveries"], "ps_updates_lost": r["ps_updates_lost"],
               "nn_recoveries": r["dense_recoveries"], "dense_steps_lost": r["dense_steps_lost"],
               "dense_allreduce_seconds": self._allreduce(r["applied"], r["waited"])}
        if "dense_staleness" in r:
            out["dense_staleness"] = {str(k): v for k, v in r["dense_staleness"].items()}
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
        p, r = self.p, self._read()
        steps = self.rt.total_steps - self.rt.start_step
        allreduce = self._allreduce(steps, r["waited"])
        out = {
            "persia_mode": p.mode, "persia_nn_workers": p.nn_workers,
            "persia_embedding_workers": p.embedding_workers,
            "persia_local_batch_size": p.local_batch, "persia_staleness_bound": p.tau,
            "persia_compress": self.codec.kind,
            "embedding_staleness": histogram_summary(r["staleness"]),
            "embedding_updates": r["applied"],
            "dense_allreduce_seconds": allreduce,
            "dense_allreduce_seconds_per_step": allreduce / max(steps, 1),
            "bytes": _bytes(r["raw"], r["wire"]),
            "ps_recoveries": r["ps_recoveries"],
            "ps_updates_lost": r["ps_updates_lost"],
            "nn_recoveries": r["dense_recoveries"],
            "dense_steps_lost": r["dense_steps_lost"],
        }
        if "dense_staleness" in r:
            out["dense_staleness"] = histogram_summary(r["dense_staleness"])
        return out


def _bytes(raw: dict, wire: dict) -> dict:
    """The summary's ``bytes``: per role pair, raw and as sent."""
    return {pair: {"raw": raw[pair], "sent": wire[pair]} for pair in sorted(raw)}


def run(cfg: Config) -> dict:
    """``--algo persia``: train, evaluate, return (and write) the summary."""
    return intervals.run(cfg, plan(cfg).nn_workers, lambda rt: Persia(rt).run())
