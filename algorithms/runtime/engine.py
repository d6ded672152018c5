"""The host-async engine (DESIGN.md section 4.2): what the roles of one run share.

An algorithm (``async_ps.py``, ``shadowsync.py``, ``gba.py``) builds a `Runtime`, picks a batch
supply, writes its roles as generators (``clock.py``) around the pure jitted pieces of
`recjax.train.step`, and calls `Runtime.execute` then `Runtime.finish`:

    rt = Runtime(cfg, num_workers=W)      # data, model, optimizers, resume, embedding PS, links
    supply = rt.static_shards()           # or rt.shared_list(M): GBA's data list
    workers = [rt.worker(w, supply) for w in range(W)]
    roles = [RoleSpec(f"worker-{w}", my_worker(rt, wk)) for w, wk in enumerate(workers)]
    sched = rt.execute(roles, supply, snapshot=...)   # threads, or the virtual clock
    return rt.finish(params, opt_state, sched, workers, counters, step=...)  # eval, files

Under ``--backend ray`` (``ray_backend.py``, ``ray_ps.py``, ``ray_workers.py``) the embedding
PS shards, the worker groups' compute and the servers given to `Runtime.host` are Ray actor
processes; the roles are the same and still run here, in threads.

Pieces: ``worker.py``'s `Worker` (takes batches from the supply, a jitted gradient on the rows
it pulled, its counters) and `Replica` (a trainer's dense params, shared lock-free by its worker
threads and its shadow thread), the parameter servers of ``ps.py`` (values in, values out), `clock.Link` (a PS
link with a bandwidth), the supplies of ``supply.py``. Every thread is started by
`recjax.concurrency.ThreadGroup`; an exception in any role, a failing PS shard or Ctrl-C stops
all of them within a poll interval, and the run's checkpoints (written only between runs of
the roles) stay usable. The run contract (``--out`` policy, resume check, Train NE across
segments, eval, summary) is `recjax.train.contract`, shared with every other trainer.

``TrainState.step`` is global steps, as everywhere: examples consumed / ``train.batch_size``.
A worker batch of async / ShadowSync is ``train.batch_size`` rows (one step per iteration);
GBA's workers take ``B_a``-row entries and M of them are one global step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.runtime import ps as ps_lib
from algorithms.runtime import report, stragglers
from algorithms.runtime.clock import Link, RoleSpec, Schedule, run_threaded, run_virtual
from algorithms.runtime.segments import SEGMENT, Abandoned, StateLost, stoppable, with_latest
from algorithms.runtime.supply import SharedList, StaticShards
from algorithms.runtime.watchdog import Watchdog
from algorithms.runtime.worker import (
    LocalFn,
    Worker,
    make_grads,
    mini_layout,
    with_vocab,
)
from recjax.concurrency import ThreadGroup
from recjax.config import Config
from recjax.data.pipeline import batches, cached
from recjax.data.synthetic import SyntheticSource
from recjax.train import contract, signals
from recjax.train.data import open_data, train_shuffle_buffer
from recjax.train.setup import build, check_memory, init_scale, make_model
from recjax.train.step import (
    Model,
    StepMetrics,
    TrainState,
    apply_dense,
    jit_predict,
)


class Runtime:
    """Everything the roles of one run share; see the module docstring.

    Args:
      cfg: the run's config (``runtime`` section for the engine).
      num_workers: worker roles of the run (stragglers are drawn for each).
      batch_size: rows of one worker batch (default ``train.batch_size``; GBA's B_a).
    """

    def __init__(self, cfg: Config, num_workers: int, batch_size: int = 0):
        self.t0 = time.perf_counter()
        self.cfg, rc, tc = cfg, cfg.runtime, cfg.train
        self.ckpt = self.cluster = None
        self.backend = "virtual" if tc.deterministic else rc.backend
        self.dense_on_actor = False  # ray: the dense gradients' consumer is an actor
        self._stop_saving: tuple = (KeyboardInterrupt,)  # stops that leave a checkpoint
        try:
            self._setup(cfg, num_workers, batch_size)
        except BaseException:
            self.close()  # no Ray process outlives a failed start
            raise

    def _setup(self, cfg: Config, num_workers: int, batch_size: int) -> None:
        rc, tc = cfg.runtime, cfg.train
        if self.backend == "ray":
            from algorithms.runtime import ray_backend, ray_ps, ray_workers

            self.cluster = ray_backend.Cluster(cfg.ray, cfg.train.out)
            self.groups = ray_workers.Groups(self)
            self._stop_saving = (KeyboardInterrupt, ray_ps.PsFailed, ray_backend.ControlLost)
        self.num_workers = num_workers
        self.batch_size = batch_size or tc.batch_size
        self.data = open_data(cfg)
        self._shuffle = train_shuffle_buffer(self.data, cfg.data.shuffle_buffer)
        if isinstance(self.data.train, SyntheticSource):  # generate once, not once per worker
            self.data.train = cached(self.data.train, cfg.data.cache_rows)
            for _ in self.data.train.chunks():
                pass
        lru = cfg.embed.store == "lru"
        if lru:  # raw 64-bit ids: the tables are LRU stores of `capacity` rows, built below
            _, self.tx, self.sparse_opt, state = build(cfg, with_vocab(self.data.spec, 1))
            self.model = make_model(cfg, with_vocab(self.data.spec, cfg.embed.capacity))
            check_memory(cfg, self.model.layout, self.sparse_opt, lru=True)
        else:  # under Ray each PS shard initialises its own tables: none in this process
            self.model, self.tx, self.sparse_opt, state = build(
                cfg, self.data.spec, tables=self.cluster is None)
        layout = self.model.layout
        self.max_len = self.data.spec.max_len
        self.mini_layout = self._mini(self.batch_size)  # tables of one worker batch's rows
        self.mini_model = Model(self.model.module, self.mini_layout, self.model.microbatches)
        mini, mini_model = self.mini_layout, self.mini_model
        profile = [b for b, _ in self._global_batches(rc.profile_batches)]
        self.costs = ps_lib.profile_costs(layout, profile)
        self.placement = ps_lib.place(self.costs, rc.ps_shards, rc.placement)
        if lru:
            self.ps = self._make_ps({}, {}, dict(
                capacity=cfg.embed.capacity, seed=tc.seed, init=init_scale(cfg),
                admit_probability=cfg.embed.admit_probability))
            state = state._replace(**dict(zip(("tables", "slots"), self.ps.snapshot())))
        run_start = SEGMENT.get()  # set when this goes on from the run's periodic checkpoint
        self.resuming = tc.resume or run_start is not None
        self.ckpt, state, self.progress = contract.open_run(cfg, state, resume=self.resuming)
        self.init_state = state
        self.start_step = int(state.step)
        self.run_start = self.start_step if run_start is None else run_start
        self.steps_per_epoch = self.data.train_rows // tc.batch_size
        self.run_steps = tc.steps or tc.epochs * self.steps_per_epoch  # the run's last step
        if tc.resume and self.start_step >= self.run_steps:
            raise ValueError(f"the checkpoint is at step {self.start_step}, which already reaches "
                             f"the requested {self.run_steps} steps; raise --steps (or --epochs) "
                             "to go on")
        self.total_steps = self._segment_end()  # where the roles of this call stop
        self.stragglers = stragglers.parse(rc.stragglers, num_workers, tc.seed)
        self.example_cost = rc.example_cost_us * 1e-6
        bw = rc.bandwidth_gbps * 1e9 / 8
        self.shard_links = [Link(f"emb-ps-{s}", bw) for s in range(rc.ps_shards)]
        self.bandwidth = (rc.sync_bandwidth_gbps * 1e9 / 8) if rc.sync_bandwidth_gbps > 0 else bw
        self.dense_link = Link("sync-ps", self.bandwidth)  # dense bandwidth: also all-reduce

        if lru:
            if self.start_step:
                self.ps.restore(state.tables, state.slots)
        else:
            self.ps = self._make_ps(state.tables, state.slots, None)
        for shard in self.ps.shards:  # the sparse optimizer's step goes on from the checkpoint
            if shard.tables and self.start_step:  # (a new shard's is 0; under Ray a set costs
                shard.step = self.start_step      # a snapshot of its tables)
        # The PS owns the tables from here (its shards made their own copies): the engine keeps
        # the dense state only, or the host would hold every table twice (dlrm_kaggle: 1.1 GB).
        self.init_state = self.init_state._replace(tables={}, slots={})

        grads, grads_rows = make_grads(mini, mini_model)
        self.grads = jax.jit(grads)
        self.grads_rows = jax.jit(grads_rows)
        self._fns: dict = {}
        self.dense_apply = jax.jit(lambda p, o, g: apply_dense(self.tx, p, o, g))
        self.dense_bytes = sum(int(x.size) * 4 for x in jax.tree.leaves(state.params))
        # Compile before any thread starts (compiling holds the GIL: PERF_NOTES 5).
        local, rows = ps_lib.localize(layout, profile[0])
        self.warm_batch = (local, rows)
        _, g, rg = self.grads(state.params, self.ps.pull(rows, admit=False), local)
        jax.block_until_ready(self.dense_apply(state.params, state.opt_state, g))
        self.ps.warm(rows, rg)

    @property
    def periodic(self) -> bool:
        """Checkpoints every ``train.ckpt_every`` steps (`run_in_segments`)."""
        return bool(self.cfg.train.ckpt_every and self.ckpt is not None)

    def _segment_end(self) -> int:
        """The step the roles run to: the run's last step, ``train.stop_after``, or with
        periodic checkpoints the next multiple of ``train.ckpt_every`` (a tail shorter than
        the workers joins the interval before it, so every worker gets a batch)."""
        tc = self.cfg.train
        end = self.run_steps
        if self.periodic:
            k = tc.ckpt_every
            nxt = (self.start_step // k + 1) * k
            if end - nxt >= self.num_workers:
                end = nxt
        if self.start_step < tc.stop_after < end:
            end = tc.stop_after
        return end

    def _make_ps(self, tables: dict, slots: dict, lru: dict | None) -> ps_lib.EmbeddingPS:
        """The embedding PS: shards in this process, or Ray actors (``--backend ray``)."""
        rc = self.cfg.runtime
        if self.cluster is not None:
            from algorithms.runtime import ray_ps

            return ray_ps.RayEmbeddingPS(self.cluster, self.cfg, self.model.layout, tables,
                                         slots, self.placement, rc.ps_shards, lru=lru)
        return ps_lib.EmbeddingPS(self.model.layout, tables, slots, self.sparse_opt,
                                  self.placement, rc.ps_shards, lru=lru)

    def host(self, cls: type, factory, *args, **proxy) -> Any:
        """Under Ray, a server the roles share in an actor of its own: a `ray_wire.Hosted`
        proxy (of `cls`'s methods) of ``factory(*args)`` built there; `proxy` keywords say
        which attributes stay local, which methods notify, which results stay references.
        Without Ray the roles share the server object itself, so there is nothing to host."""
        if self.cluster is None:
            raise RuntimeError("Runtime.host is for --backend ray: without it, share the server")
        from algorithms.runtime import ray_wire

        handle = self.cluster.spawn(ray_wire._Host, factory, *args, concurrency=16,
                                    resource=self.cfg.ray.ps_resource)
        self.cluster.watch(handle, f"the Ray actor of {cls.__name__}")
        return ray_wire.Hosted(handle, cls, **proxy)

    def remote_fn(self, group: int, name: str, factory, *args):
        """``jax.jit(factory(rt, *args))`` as a `LocalFn`, or under Ray the same function
        compiled in worker group `group`'s actor and called there (`RemoteFn`: numpy in, numpy
        out); both also time a call (``.timed``)."""
        if self.cluster is None:
            key = (name, args)
            if key not in self._fns:
                self._fns[key] = LocalFn(jax.jit(factory(self, *args)))
            return self._fns[key]
        from algorithms.runtime import ray_workers

        return ray_workers.RemoteFn(self.groups, group, name, factory, args)

    def _mini(self, rows: int):
        """The layout of per-batch mini tables: every touched row of a `rows`-row batch."""
        return mini_layout(self.model.layout, rows, self.data.spec.max_len)

    def _predict(self):
        """``(params, tables, batch) -> logits`` for eval: the full tables, or (LRU store) the
        rows looked up through the PS without admitting anything."""
        if not self.ps.lru:
            return jit_predict(self.model)
        model = Model(self.model.module, self._mini(self.cfg.train.eval_batch_size),
                      self.model.microbatches)
        pred = jit_predict(model)

        def predict(params, _tables, batch):
            local, rows = self._localize(batch)
            return pred(params, self.ps.pull(rows, admit=False), local)

        return predict

    def _global_batches(self, n: int):
        stream = batches(self.data.train, self.batch_size, seed=self.cfg.train.seed,
                         epoch=0, shuffle_buffer=self._shuffle, drop_remainder=True,
                         keep=self.data.keep_train)
        for i, b in enumerate(stream):
            if i >= max(n, 1):
                break
            yield b

    def _localize(self, batch):
        return ps_lib.localize(self.model.layout, batch)

    @property
    def _depth(self) -> int:
        return 0 if self.cfg.train.deterministic else self.cfg.data.prefetch

    def static_shards(self) -> StaticShards:
        """Per-worker shards: the workers train the ``total - start`` remaining steps between
        them (one batch each per step), so the run ends at exactly the requested step.

        A resumed run continues each worker's shard where it stopped: exact after a completed
        segment of equal shares; after a Ctrl-C, workers resume at their average position.
        """
        remaining = self.total_steps - self.start_step
        k, w = self.cfg.train.ckpt_every, self.num_workers
        if self.periodic and k % w:
            raise ValueError(f"--train.ckpt_every={k} must be a multiple of the {w} workers "
                             f"(e.g. {k - k % w or w}): each interval gives every worker the "
                             "same number of batches, so its shard goes on where it stopped")
        if remaining < self.num_workers:
            raise ValueError(f"{remaining} steps cannot feed {self.num_workers} workers; "
                             "raise --steps or lower --trainers / --workers-per-trainer")
        return StaticShards(self.data, self.batch_size, self.cfg.train.seed, self._shuffle,
                            self.num_workers, self.start_step // self.num_workers, remaining,
                            self._localize, self._depth)

    def shared_list(self, m: int, localize: bool = True) -> SharedList:
        """GBA's data list: M entries of ``B_a`` rows per global step, from the resumed step.

        With ``localize=False`` the entries are the batches as read (Persia's embedding workers
        localize the ids they receive themselves)."""
        return SharedList(self.data, self.batch_size, self.steps_per_epoch * m,
                          self.cfg.train.seed, self._shuffle, self.start_step * m,
                          self.total_steps * m, self._localize if localize else None,
                          self._depth)

    def worker(self, wid: int, supply: StaticShards | SharedList, group: int | None = None,
               group_size: int = 1) -> Worker:
        """Worker `wid`; under Ray its compute runs in worker group `group`'s actor process
        (default: a process of its own; ShadowSync groups a trainer's `group_size` workers,
        which get as many XLA threads there)."""
        if self.cluster is not None:
            from algorithms.runtime import ray_workers

            return ray_workers.RayWorker(self, wid, supply, wid if group is None else group,
                                         group_size)
        return Worker(self, wid, supply)

    def state(self, params: Any, opt_state: Any, step: int) -> TrainState:
        """A consistent `TrainState` at global `step` (call when no role runs)."""
        tables, slots = self.ps.snapshot()
        return TrainState(jnp.asarray(step, jnp.int32), params, opt_state, tables, slots)

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
        if self.cluster is not None:
            self.cluster.stop()

    def _totals(self, workers: list[Worker], completed: bool = False) -> dict:
        """StepMetrics sums of the batches the workers scored (`completed`: only those of
        iterations they completed, as at a step the roles were stopped at early)."""
        ms = [m for w in workers
              for m in w.counters.metrics[:w.counters.iterations if completed else None]]
        return contract.sum_metrics(ms) if ms else dict.fromkeys(StepMetrics._fields, 0.0)

    def execute(self, roles: list[RoleSpec], supply, snapshot=None, workers=(), counters=None,
                step=None) -> Schedule:
        """Run the roles (virtual clock with ``--deterministic``, else threads).

        Args:
          roles: every role of the run.
          supply: the batch supply (closed at the end).
          snapshot: ``() -> (params, opt_state, global step)`` to checkpoint on Ctrl-C and to
            evaluate every ``train.eval_every`` steps.
          workers: the `Worker`\\ s (their scored batches make the train records).
          counters: ``() -> dict`` of the algorithm's counters, recorded over time.
          step: ``() -> global step reached`` (default: start + the workers' iterations).
        """
        self.report = report.Reporter(self, workers, step, snapshot, counters)
        # A role that makes no progress for runtime.watchdog_s is named, its stack printed, and
        # the run stopped with a checkpoint (issue 16, item 10); threads only: on the virtual
        # clock every role runs in this thread, between events.
        dog = Watchdog([r.name for r in roles], self.cfg.runtime.watchdog_s)
        if self.cfg.train.deterministic:
            # Signals are read between events, never inside a role: the state stays whole. With
            # periodic checkpoints the first one lets the interval finish (its checkpoint keeps
            # the run bit-reproducible), a second one abandons the interval.
            stop_at = 2 if self.periodic else 1
            roles = [dataclasses.replace(r, role=stoppable(r.role, stop_at)) for r in roles]
        else:
            roles = [dataclasses.replace(r, role=dog.watch(i, r.role))
                     for i, r in enumerate(roles)]

        vital = self.cluster.check if self.cluster is not None else lambda now=False: None

        def on_poll():
            dog.check("recjax-rt-")
            vital()
            self.report.on_poll()

        def on_event(now: float) -> bool:
            vital()
            return self.report.on_event(now)

        self.report.on_wait = lambda: dog.check("recjax-rt-")

        try:
            if signals.requested() and not (self.cfg.train.deterministic and self.periodic):
                raise KeyboardInterrupt  # a stop signal came while the run was being set up
            if self.cfg.train.deterministic:
                return run_virtual(roles, on_event)
            if self.cluster is not None:  # compile every worker group before the clock runs
                self.groups.warm_all(self.init_state.params, self.warm_batch)
            group = ThreadGroup("recjax-rt")
            self.report.bind(group.stop)
            roles = [dataclasses.replace(r, role=self.report.wrap(r.role)) for r in roles]
            sched = run_threaded(roles, group, self.cfg.runtime.emulate_links, on_poll)
            sched.seconds -= self.report.paused  # evals and records are not training time
            return sched
        except BaseException as e:  # Ctrl-C, or a PS process gone for good: a checkpoint
            self.report.close()
            lost = self._diagnose(e)
            if isinstance(lost, Abandoned):
                last = self.ckpt.latest_step() if self.ckpt is not None else None
                print(f"stopped at once; the checkpoint at step {last} is the latest")
            elif isinstance(lost, StateLost):
                lost = self._with_latest(lost)
            elif isinstance(lost, (*self._stop_saving, TimeoutError)):
                self._save_stopped(snapshot, workers, "interrupted"
                                   if isinstance(lost, KeyboardInterrupt) else "stopped")
            self.close()
            if lost is e:
                raise
            raise lost from e
        finally:
            supply.close()

    def _with_latest(self, e: StateLost) -> StateLost:
        if self.ckpt is not None:
            self.ckpt.close()  # an async save in flight commits first
        return with_latest(e, self.cfg.train.out)

    def _diagnose(self, e: BaseException) -> BaseException:
        """The failure to act on: `e`, or under Ray the death of a vital process that caused
        it (a role's call to an actor of a dead raylet fails in Ray's own words first)."""
        if self.cluster is None or isinstance(e, (StateLost, KeyboardInterrupt)):
            return e
        try:
            self.cluster.check(now=True)
        except OSError as lost:
            return lost
        return e

    def _save_stopped(self, snapshot, workers, why: str) -> None:
        """Checkpoint the roles' state after they stopped early (Ctrl-C, a lost PS)."""
        if self.ckpt is None or snapshot is None:
            return
        params, opt_state, step = snapshot()
        totals = self._totals(workers)
        contract.check_finite(totals, f"before step {step}", self.ckpt)
        self.progress.add(totals)
        if self.report.stopper is not None:  # the best so far goes on after a --resume
            self.progress.early_stop = self.report.stopper.state()
        contract.save(self.ckpt, self.cfg, self.state(params, opt_state, step), self.progress,
                      time.perf_counter() - self.t0, interrupted=True)
        print(f"{why} at step {step}; checkpoint in {self.cfg.train.out}")

    def finish(self, params: Any, opt_state: Any, sched: Schedule, workers: list[Worker],
               extra: dict, step: int | None = None) -> dict:
        """Eval the returned model, checkpoint, write metrics.jsonl and summary.json.

        Args:
          step: the global step reached (default: start + the workers' iterations, one global
            step each).
        """
        cfg, tc = self.cfg, self.cfg.train
        if self.cluster is not None:  # roles that all ended on a dead raylet end here
            try:
                self.cluster.check(now=True)
            except StateLost as e:
                self.close()
                raise self._with_latest(e) from None
            except OSError:  # only GCS is gone: the actors' state is whole, finish as planned
                pass
        iterations = sum(w.counters.iterations for w in workers)
        report = self.report
        if report.early is not None:  # early stopping ended the roles at an eval
            state, ev, preds = report.early
            step = int(state.step)
        else:
            step = self.start_step + iterations if step is None else step
            state = self.state(params, opt_state, step)
        totals = self._totals(workers, completed=report.early is not None)
        contract.check_finite(totals, f"in steps {self.start_step + 1}-{step}", self.ckpt)
        self.progress.add(totals)
        wall = time.perf_counter() - self.t0
        self.progress.train_seconds += sched.seconds
        self.progress.timed_steps += step - self.start_step
        # the roles were to stop before the run's end: a checkpoint interval or stop_after (a
        # run that ends short because it lost a role is at its end: it gets its summary)
        at_end = report.early is not None or self.total_steps >= self.run_steps
        if at_end and report.early is None:  # the final eval counts for the best checkpoint
            ev, preds = contract.evaluate(cfg, self.data, self._predict(), state.params,
                                          state.tables)
            report.track(step, ev, state)
        elif not at_end:  # an interval's end: the eval due there (mid-interval ones: `report`)
            ev = preds = None
            if tc.eval_every and step % tc.eval_every == 0 and step < self.run_steps:
                ev, preds = contract.evaluate(cfg, self.data, self._predict(), state.params,
                                              state.tables)
                at_end = report.track(step, ev, state)  # early stopping at the boundary
        if report.stopper is not None:
            self.progress.early_stop = report.stopper.state()
        if self.ckpt is not None:
            contract.save(self.ckpt, cfg, state, self.progress, wall)
            self.ckpt.close()
        if not at_end:
            report.boundary(step, sched.seconds, ev, extra)
            if self.cluster is not None:
                self.cluster.stop()
            return {"stopped_at": step, "steps": step, "run_start": self.run_start,
                    "next_segment": self.periodic and step < (self.cfg.train.stop_after
                                                              or self.run_steps)}
        if self.ps.lru:
            extra = {"lru": self.ps.lru_counters(), **extra}
        extra = {"backend": self.backend, "lost_roles": sched.lost, **extra}
        if self.cluster is not None:
            extra.update(self.ps.fault_counters(), ray_worker_groups=len(self.groups.handles),
                         ray_worker_respawns=self.groups.respawns)
            self.cluster.stop()
        shard = np.sum([w.counters.shard_bytes for w in workers], axis=0).tolist()
        unit = "virtual" if tc.deterministic else "wall"
        summary = contract.build_summary(
            cfg, self.data, state, self.progress, ev, start_step=self.run_start,
            wall_seconds=self.progress.wall_seconds + wall,
            train_seconds=self.progress.train_seconds, timed_steps=self.progress.timed_steps,
            clock=unit, extra={
                "segment_seconds": sched.seconds,
                "segment_examples_per_sec": (step - self.start_step) * tc.batch_size
                / max(sched.seconds, 1e-12),
                "worker_iterations": iterations, "worker_batch_size": self.batch_size,
                "trainers": cfg.runtime.trainers,
                "workers_per_trainer": cfg.runtime.workers_per_trainer,
                "stragglers": cfg.runtime.stragglers,
                "embedding_bytes": int(sum(shard)), "embedding_bytes_per_shard": shard,
                "ps_placement": cfg.runtime.placement, "ps_table_to_shard": self.placement,
                "ps_load_profile": {how: ps_lib.shard_loads(self.costs, ps_lib.place(
                    self.costs, cfg.runtime.ps_shards, how), cfg.runtime.ps_shards)
                    for how in ("mod", "binpack")},
                "virtual_events": sched.events if tc.deterministic else None,
                **extra, **(report.stopper.summary() if report.stopper is not None else {})})
        self.report.final(step, sched.seconds, None if report.early is not None else ev, extra)
        contract.write_summary(cfg, summary, preds)
        return summary | {"final_state": state, "schedule": sched}

