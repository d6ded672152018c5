"""The host-async runtime (DESIGN.md section 4.2): trainers, workers, PS shards, one process.

An algorithm (``async_ps.py``, ``shadowsync.py``) builds a `Runtime` from its config, writes its
roles as generators (see ``clock.py``) around the pure jitted pieces of `recjax.train.step`, and
calls `Runtime.execute` then `Runtime.finish`:

    rt = Runtime(cfg)                     # data, model, optimizers, embedding PS (placed), links
    roles = [RoleSpec(f"worker-{w}", my_worker(rt, rt.worker(w))) for w in range(rt.num_workers)]
    sched = rt.execute(roles)             # threads, or the virtual clock with --deterministic
    return rt.finish(params, opt_state, sched, counters)   # eval, checkpoint, summary.json

Pieces: `Worker` (one worker's data shard, a jitted gradient on the rows it pulled, counters),
`Replica` (a trainer's dense params, shared lock-free by its worker threads and its shadow
thread), `ps.EmbeddingPS` / `ps.SyncPS` / `ps.DensePS` (parameter servers), `clock.Link` (a PS
link with a bandwidth). Every thread is started by `recjax.concurrency.ThreadGroup`; an
exception in any role, a failing PS shard or Ctrl-C stops all of them within a poll interval,
and the run's checkpoints (written only between runs of the roles) stay usable.

How the next algorithms plug in without rewriting this (DESIGN.md section 5):

* **GBA** (token list, gradient buffer): a `TokenPS` beside `ps.DensePS` whose ``pull`` hands
  out ``(params, token = floor(i / M))`` and whose ``push(grads, token)`` appends to a buffer of
  M gradients, drops those with ``k - token > iota`` and applies the average once per global
  step; embedding pushes go through an `EmbeddingPS` subclass whose ``push`` buffers row
  gradients and averages each row over the workers that touched it. The worker role is the
  async one with a token in its `Work`-separated pull/push; Hop-BS/BSP/Hop-BW are other
  buffer policies of the same PS.
* **Persia** (bounded-staleness lookups, dense all-reduce): the embedding side is `Worker`'s
  pull/push with a version check (a pull may use rows at most tau pushes old: a role yields
  `Work` until the shard's ``step`` catches up); the dense side is a `clock.Collective` over a
  `clock.Rendezvous` of the NN workers every step (``sync_rules.tree_mean`` of the gradients),
  exactly how FR-MA all-reduces replicas; an LRU shard is another `EmbeddingShard`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from algorithms import ps as ps_lib
from algorithms import stragglers
from algorithms.clock import Link, RoleSpec, Schedule, Work, run_threaded, run_virtual
from recjax.checkpoint import Checkpointer
from recjax.concurrency import Prefetcher, ThreadGroup
from recjax.config import Config
from recjax.data.pipeline import batches, cached
from recjax.data.synthetic import SyntheticSource
from recjax.embeddings import lookup, row_gradients
from recjax.runlog import MetricsWriter, write_json_atomic
from recjax.train import loop
from recjax.train.data import open_data
from recjax.train.setup import build, count_params
from recjax.train.step import (
    Model,
    StepMetrics,
    TrainState,
    apply_dense,
    jit_predict,
    loss_and_grads,
    step_metrics,
)


class Replica:
    """A trainer's dense params and optimizer state, shared by its threads without a lock.

    Each update is a read-modify-write of the attribute (one jitted call in between), so a
    concurrent update can be lost: Hogwild's race, at the granularity of the pytree.
    """

    def __init__(self, params: Any, opt_state: Any):
        self.params, self.opt_state = params, opt_state

    def apply(self, dense_apply, grads: Any) -> None:
        self.params, self.opt_state = dense_apply(self.params, self.opt_state, grads)


@dataclasses.dataclass
class Counters:
    """A role's counters (owned by one role: no locks). Attributes:
      iterations: training iterations done.
      metrics: per-iteration `StepMetrics` (each batch scored before its update).
      shard_bytes: embedding bytes served per PS shard.
      syncs: syncs performed.
      sync_bytes: bytes moved by syncs.
    """

    iterations: int = 0
    metrics: list = dataclasses.field(default_factory=list)
    shard_bytes: list = dataclasses.field(default_factory=list)
    syncs: int = 0
    sync_bytes: int = 0


class Worker:
    """One worker: its shard of the data, its counters, and one iteration's pull/compute/push."""

    def __init__(self, rt: Runtime, wid: int, quota: int):
        self.rt, self.wid, self.quota = rt, wid, quota
        self.counters = Counters(shard_bytes=[0] * rt.ps.num_shards)
        self._stream = None

    def compute(self, params: Any, it: int) -> tuple[Any, tuple, Work]:
        """Pull rows, compute gradients at `params`: ``(g_params, pending push, Work)``."""
        rt = self.rt
        if self._stream is None:
            self._stream = rt.stream(self.wid, self.quota)
        local, rows = next(self._stream)
        minis = rt.ps.pull(rows)
        m, g_params, grads = rt.grads(params, minis, local)
        self.counters.metrics.append(m)
        nbytes = rt.ps.shard_bytes(rows)
        for s, b in enumerate(nbytes):
            self.counters.shard_bytes[s] += b
        work = Work(rt.example_cost * rt.cfg.train.batch_size, rt.stragglers.factor(self.wid, it),
                    tuple((link, b) for link, b in zip(rt.shard_links, nbytes) if b))
        return g_params, (rows, grads), work

    def push(self, pending: tuple) -> None:
        self.rt.ps.push(*pending)
        self.counters.iterations += 1

    def close(self) -> None:
        if isinstance(self._stream, Prefetcher):
            self._stream.close()


class Runtime:
    """Everything the roles of one run share; see the module docstring.

    Args:
      cfg: the run's config (``runtime`` section for the topology).
    """

    def __init__(self, cfg: Config):
        self.t0 = time.perf_counter()
        self.cfg, rc, tc = cfg, cfg.runtime, cfg.train
        if min(rc.trainers, rc.workers_per_trainer, rc.ps_shards) < 1:
            raise ValueError("runtime.trainers, workers_per_trainer and ps_shards must be >= 1")
        self.data = open_data(cfg)
        self._shuffle = 0 if isinstance(self.data.train, SyntheticSource) else cfg.data.shuffle_buffer
        if isinstance(self.data.train, SyntheticSource):  # generate once, not once per worker
            self.data.train = cached(self.data.train, cfg.data.cache_rows)
            for _ in self.data.train.chunks():
                pass
        self.model, self.tx, self.sparse_opt, state = build(cfg, self.data.spec)
        if tc.resume:
            ck = self._checkpointer()
            state, _ = ck.restore(state)
            ck.close()
        self.init_state = state
        self.num_workers = rc.trainers * rc.workers_per_trainer
        total = tc.steps or tc.epochs * (self.data.train_rows // tc.batch_size)
        start = int(state.step)
        if tc.resume and start >= total:
            raise ValueError(f"the checkpoint is at step {start}, which already reaches the "
                             f"requested {total} steps; raise --steps (or --epochs) to go on")
        # A resumed run trains the remaining steps, each worker continuing its own data shard
        # where it stopped: exact after a completed segment (equal quotas); after a Ctrl-C,
        # workers resume at their average position.
        self.skip = start // self.num_workers
        self.quota = (total - start) // self.num_workers
        if self.quota < 1:
            raise ValueError(f"{total} steps cannot feed {self.num_workers} workers; "
                             "raise --steps or lower --trainers / --workers-per-trainer")
        self.stragglers = stragglers.parse(rc.stragglers, self.num_workers, tc.seed)
        self.example_cost = rc.example_cost_us * 1e-6
        bw = rc.bandwidth_gbps * 1e9 / 8
        self.shard_links = [Link(f"emb-ps-{s}", bw) for s in range(rc.ps_shards)]
        self.bandwidth = (rc.sync_bandwidth_gbps * 1e9 / 8) if rc.sync_bandwidth_gbps > 0 else bw
        self.dense_link = Link("sync-ps", self.bandwidth)  # dense bandwidth: also all-reduce

        layout = self.model.layout
        mini = dataclasses.replace(layout, tables=tuple(
            dataclasses.replace(t, num_embeddings=tc.batch_size * len(t.field_index)
                                * self.data.spec.max_len) for t in layout.tables))
        mini_model = Model(self.model.module, mini, self.model.microbatches)
        profile = [b for b, _ in self._global_batches(rc.profile_batches)]
        self.costs = ps_lib.profile_costs(layout, profile)
        self.placement = ps_lib.place(self.costs, rc.ps_shards, rc.placement)
        self.ps = ps_lib.EmbeddingPS(layout, state.tables, state.slots, self.sparse_opt,
                                     self.placement, rc.ps_shards)

        def grads(params, minis, batch):
            acts = lookup(mini, minis, batch.ids, batch.mask)
            (loss, logits), (g_params, g_acts) = loss_and_grads(mini_model, params, acts, batch)
            rows = row_gradients(mini, g_acts, batch.ids, batch.mask)
            return step_metrics(loss, logits, batch.label), g_params, rows

        self.grads = jax.jit(grads)
        self.dense_apply = jax.jit(lambda p, o, g: apply_dense(self.tx, p, o, g))
        self.dense_bytes = sum(int(x.size) * 4 for x in jax.tree.leaves(state.params))
        # Compile before any thread starts (compiling holds the GIL: PERF_NOTES 5).
        local, rows = ps_lib.localize(layout, profile[0])
        _, g, rg = self.grads(state.params, self.ps.pull(rows), local)
        jax.block_until_ready(self.dense_apply(state.params, state.opt_state, g))
        self.ps.warm(rows, rg)

    def _global_batches(self, n: int):
        stream = batches(self.data.train, self.cfg.train.batch_size, seed=self.cfg.train.seed,
                         epoch=0, shuffle_buffer=self._shuffle, drop_remainder=True,
                         keep=self.data.keep_train)
        for i, b in enumerate(stream):
            if i >= max(n, 1):
                break
            yield b

    def stream(self, wid: int, quota: int):
        """Worker `wid`'s batches (its ``row % W`` share, epoch after epoch), localized."""
        cfg, layout = self.cfg, self.model.layout

        def gen():
            n, seen, epoch = 0, 0, 0
            while True:
                got = False
                for batch, _ in batches(self.data.train, cfg.train.batch_size, seed=cfg.train.seed,
                                        epoch=epoch, shuffle_buffer=self._shuffle,
                                        drop_remainder=True, worker=wid,
                                        num_workers=self.num_workers, keep=self.data.keep_train):
                    got, seen = True, seen + 1
                    if seen <= self.skip:  # consumed before the checkpoint this run resumes
                        continue
                    yield batch
                    n += 1
                    if n >= quota:
                        return
                if not got:
                    raise ValueError(f"worker {wid} of {self.num_workers} gets less than one batch "
                                     f"of {cfg.train.batch_size} per epoch; lower --batch-size")
                epoch += 1

        depth = 0 if cfg.train.deterministic else cfg.data.prefetch
        return Prefetcher(gen(), depth=depth, transform=lambda b: ps_lib.localize(layout, b),
                          name=f"recjax-prefetch-w{wid}")

    def worker(self, wid: int) -> Worker:
        return Worker(self, wid, self.quota)

    def _checkpointer(self) -> Checkpointer:
        return Checkpointer(os.path.join(self.cfg.train.out, "checkpoints"), self.cfg.train.keep_ckpts)

    def state(self, params: Any, opt_state: Any, steps: int) -> TrainState:
        """A consistent `TrainState` (call when no role runs): the given dense, the PS tables."""
        return TrainState(jnp.asarray(int(self.init_state.step) + steps, jnp.int32), params,
                          opt_state, self.ps.tables(), self.ps.slots())

    def execute(self, roles: list[RoleSpec], workers: list[Worker], snapshot=None) -> Schedule:
        """Run the roles (virtual clock with ``--deterministic``, else threads).

        Args:
          roles: every role of the run.
          workers: the `Worker`\\ s inside them (their streams are closed at the end).
          snapshot: ``() -> (params, opt_state)`` to checkpoint on Ctrl-C.
        """
        writer = MetricsWriter(self.cfg.train.out, append=self.cfg.train.resume)
        last = [time.perf_counter()]

        def on_poll():
            if time.perf_counter() - last[0] >= 1.0:
                last[0] = time.perf_counter()
                writer.write({"kind": "progress", "wall": last[0] - self.t0,
                              "iterations": sum(w.counters.iterations for w in workers)})

        try:
            if self.cfg.train.deterministic:
                return run_virtual(roles)
            group = ThreadGroup("recjax-rt")
            return run_threaded(roles, group, self.cfg.runtime.emulate_links, on_poll)
        except KeyboardInterrupt:
            if self.cfg.train.out and snapshot is not None:
                steps = sum(w.counters.iterations for w in workers)
                ck = self._checkpointer()
                ck.save(int(self.init_state.step) + steps, self.state(*snapshot(), steps),
                        {"config": self.cfg.to_dict(), "interrupted": True})
                ck.close()
                print(f"interrupted after {steps} iterations; checkpoint in {self.cfg.train.out}")
            raise
        finally:
            for w in workers:
                w.close()
            writer.close()

    def finish(self, params: Any, opt_state: Any, sched: Schedule, workers: list[Worker],
               extra: dict) -> dict:
        """Eval the returned model, checkpoint, write metrics.jsonl and summary.json."""
        cfg, tc = self.cfg, self.cfg.train
        steps = sum(w.counters.iterations for w in workers)
        state = self.state(params, opt_state, steps)
        if tc.out:
            ck = self._checkpointer()
            if ck.latest_step() != int(state.step):  # a rerun into the same --out keeps the old one
                ck.save(int(state.step), state, {"config": cfg.to_dict()})
            ck.close()
        ms = jax.device_get([m for w in workers for m in w.counters.metrics])
        totals = {k: float(sum(getattr(m, k) for m in ms)) for k in StepMetrics._fields}
        ev, preds = loop.evaluate(cfg, self.data, jit_predict(self.model), params, state.tables)
        shard = np.sum([w.counters.shard_bytes for w in workers], axis=0).tolist()
        unit = "virtual" if tc.deterministic else "wall"
        examples = steps * tc.batch_size  # of this segment (a resumed run adds to the earlier)
        summary = {
            "algorithm": tc.algo, "model": cfg.model.name, "dataset": cfg.data.train,
            "eval_dataset": self.data.eval_desc, "examples": int(state.step) * tc.batch_size,
            "steps": int(state.step),
            "resumed_from_step": int(self.init_state.step) if tc.resume else None,
            "batch_size": tc.batch_size, "wall_seconds": time.perf_counter() - self.t0,
            "clock": unit, "train_seconds": sched.seconds,
            "examples_per_sec": examples / max(sched.seconds, 1e-12),
            "train_ne": loop.ne_from_sums(totals) if totals["count"] else float("nan"),
            "eval_auc": ev["auc"], "eval_logloss": ev["logloss"], "eval_ne": ev["ne"],
            "eval_calibration": ev["calibration"], "eval_examples": ev["examples"],
            "trainers": cfg.runtime.trainers, "workers_per_trainer": cfg.runtime.workers_per_trainer,
            "stragglers": cfg.runtime.stragglers, "deterministic": tc.deterministic,
            "embedding_bytes": int(sum(shard)), "embedding_bytes_per_shard": shard,
            "ps_placement": cfg.runtime.placement, "ps_table_to_shard": self.placement,
            "ps_load_profile": {how: ps_lib.shard_loads(self.costs, ps_lib.place(
                self.costs, cfg.runtime.ps_shards, how), cfg.runtime.ps_shards)
                for how in ("mod", "binpack")},
            **count_params(state), **extra, "config": cfg.to_dict(),
        }
        if isinstance(self.data.eval, SyntheticSource) and cfg.synthetic.teacher:
            summary["bayes_eval_ne"] = self.data.eval.bayes_optimal()["ne"]
            summary["eval_ne_gap_to_bayes"] = ev["ne"] - summary["bayes_eval_ne"]
        if tc.out:
            w = MetricsWriter(tc.out, append=True)
            w.write({"kind": "eval", "step": steps, **ev})
            w.close()
            write_json_atomic(os.path.join(tc.out, "summary.json"), summary)
            if preds is not None:
                loop.write_predictions(os.path.join(tc.out, "predictions.csv"), preds)
        return summary | {"final_state": state, "schedule": sched}
