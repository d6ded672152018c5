"""The host-async engine (DESIGN.md section 4.2): what the roles of one run share, and their run.

An algorithm (``async_ps.py``, ``shadowsync.py``, ``gba.py``, ``persia.py``) builds a `Runtime`,
picks a batch supply, writes its roles as generators (``clock.py``) around the pure jitted
pieces of `recjax.train.step`, and calls `Runtime.execute` then `Runtime.finish`:

    rt = Runtime(cfg, num_workers=W)      # data, model, resume, embedding PS, compiled steps
    supply = rt.static_shards()           # or rt.shared_list(M): GBA's data list
    workers = [rt.placement.worker(w, supply) for w in range(W)]
    roles = [RoleSpec(f"worker-{w}", my_worker(rt, wk)) for w, wk in enumerate(workers)]
    sched = rt.execute(roles, supply, snapshot=...)   # threads, or the virtual clock
    return rt.finish(params, opt_state, sched, workers, counters, step=...)  # eval, files

A `Runtime` is made of parts a reader can name, each in a module of its own:

* data and supply (``supply.py``, `supply.Feed`): the run's data, the batches the PS placement
  is profiled and the functions compiled on, the supplies the workers take batches from;
* placement (``placement.py``): where the PS shards, each worker's compute and the servers the
  roles share live, in this process or as Ray actors (``ray_placement.py``), chosen once; the
  engine and the algorithms call it without asking which it is;
* the checkpoint interval (``segments.py``): where this call's roles start and stop;
* compile and warm-up (`Runtime._compile`, here): every jitted piece built and run once before
  a thread starts;
* execution (`Runtime.execute`, here): the roles on the virtual clock or on threads, watched,
  reported (``report.py``), and stopped with a checkpoint;
* the end (``finish.py``): eval, checkpoint, metrics.jsonl and summary.json.

Pieces the roles use: ``worker.py``'s `Worker` (takes batches from the supply, a jitted
gradient on the rows it pulled, its counters) and `Replica` (a trainer's dense params, shared
lock-free by its worker threads and its shadow thread), the parameter servers of ``ps.py``
(values in, values out), `clock.Link` (a PS link with a bandwidth). Every thread is started by
`recjax.concurrency.ThreadGroup`; an exception in any role, a failing PS shard or Ctrl-C stops
all of them within a poll interval, and the run's checkpoints (written only between runs of
the roles) stay usable.

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

from algorithms.runtime import finish, report, segments, stragglers
from algorithms.runtime import ps as ps_lib
from algorithms.runtime.clock import Link, RoleSpec, Schedule, run_threaded, run_virtual
from algorithms.runtime.placement import choose
from algorithms.runtime.segments import Abandoned, StateLost, stoppable
from algorithms.runtime.supply import Feed, ListOfIndices, SharedList, StaticShards
from algorithms.runtime.watchdog import Watchdog
from algorithms.runtime.worker import Worker, make_grads, mini_layout, with_vocab
from recjax.concurrency import ThreadGroup
from recjax.config import Config
from recjax.train import contract, signals
from recjax.train.setup import build, check_memory, init_scale, make_model
from recjax.train.step import Model, TrainState, apply_dense


class Runtime:
    """Everything the roles of one run share; see the module docstring.

    Args:
      cfg: the run's config (``runtime`` section for the engine).
      num_workers: worker roles of the run (stragglers are drawn for each).
      batch_size: rows of one worker batch (default ``train.batch_size``; GBA's B_a).

    Attributes (those the roles read):
      placement: where PS shards, compute and shared servers live (`placement.Placement`).
      feed, data: the run's data and the supplies cut from it (`supply.Feed`).
      ps: the embedding PS (`ps.EmbeddingPS`'s interface, whatever the placement).
      init_state: the dense state this call starts from (the tables are the PS's).
      start_step, total_steps, run_steps, run_start: `segments.Span`'s start, end, run_end
        and run_start.
      grads, grads_rows, dense_apply: the jitted steps (`worker.make_grads`, the optimizer).
      warm_batch: ``(localized batch, rows)`` every function was compiled on.
      stragglers, example_cost, shard_links, dense_link, bandwidth: the cost model.
    """

    def __init__(self, cfg: Config, num_workers: int, batch_size: int = 0):
        self.t0 = time.perf_counter()
        self.cfg, self.ckpt, self.report = cfg, None, None
        # ``() -> pytree``: the algorithm's own arrays, checkpointed beside the train state
        # (ShadowSync's replicas); set by the algorithm, read back by `restore_own`
        self.own: Any = None
        self.carry_own: Any = None  # `own` as the previous interval's checkpoint holds it
        # ``() -> dict``: the algorithm's additive counters of this call (`contract.add_counts`);
        # each checkpoint's progress holds them added to those before (`base_counts`)
        self.counts: Any = None
        self.num_workers = num_workers
        self.batch_size = batch_size or cfg.train.batch_size
        self.placement = choose(cfg, self)  # under --backend ray this starts Ray
        try:
            self._setup(cfg)
        except BaseException:
            self.close()  # no Ray process outlives a failed start
            raise

    def _setup(self, cfg: Config) -> None:
        rc, tc = cfg.runtime, cfg.train
        # data, and the model
        self.feed = Feed(cfg, self.batch_size, cache=self.placement.data_here)
        self.data, self.steps_per_epoch = self.feed.data, self.feed.steps_per_epoch
        self.max_len = self.data.spec.max_len
        lru = cfg.embed.store == "lru"
        if lru:  # raw 64-bit ids: the tables are LRU stores of `capacity` rows, built below
            _, self.tx, self.sparse_opt, state = build(cfg, with_vocab(self.data.spec, 1))
            self.model = make_model(cfg, with_vocab(self.data.spec, cfg.embed.capacity))
            check_memory(cfg, self.model.layout, self.sparse_opt, lru=True)
        else:  # tables drawn here, or (under Ray) by each PS shard's actor: shapes only here
            self.model, self.tx, self.sparse_opt, state = build(
                cfg, self.data.spec, tables=self.placement.tables_here)
        layout = self.model.layout
        self.mini_layout = mini_layout(layout, self.batch_size, self.max_len)  # one batch's rows
        self.mini_model = Model(self.model.module, self.mini_layout, self.model.microbatches)
        # the embedding PS's shards, tables placed by the load they serve (`ps.place`)
        profile = self.feed.first(rc.profile_batches)
        self.costs = ps_lib.profile_costs(layout, profile)
        table_shard = ps_lib.place(self.costs, rc.ps_shards, rc.placement)
        store = dict(capacity=cfg.embed.capacity, seed=tc.seed, init=init_scale(cfg),
                     admit_probability=cfg.embed.admit_probability) if lru else None

        def make_ps(tables, slots):
            return self.placement.make_ps(layout, self.sparse_opt, tables, slots, table_shard,
                                          rc.ps_shards, store)

        # a resume whose tables are in no process here: each shard reads its own of the step
        # (`Placement.loader`), so the shards are made first, empty
        loading = not self.placement.tables_here and tc.resume
        if lru:
            self.ps = make_ps({}, {})
            state = state._replace(**dict(zip(("tables", "slots"),
                                              self.placement.table_shapes(self.ps))))
        elif loading:
            self.ps = make_ps(None, None)
        # stragglers: draws keyed by (worker, its iteration in the interval), from the seed
        self.stragglers = stragglers.parse(rc.stragglers, self.num_workers, tc.seed)
        # where the first interval's roles start (a checkpoint?) and stop (its end?)
        self.ckpt, state, self.progress, span = segments.open_segment(
            cfg, state, self.num_workers, self.steps_per_epoch,
            loader=self.placement.loader(self.ps) if loading else None)
        if (lru and span.start or loading) and state.tables:  # (read here, not by the shards)
            self.ps.restore(state.tables, state.slots)
        elif not (lru or loading):
            self.ps = make_ps(state.tables, state.slots)
        self._begin(span, state)
        self._compile(state, self.localize(profile[0]))

    def _begin(self, span: segments.Span, state: TrainState) -> None:
        """Set up a checkpoint interval from `state` (the tables are the PS's already): where
        its roles start and stop, the links (from zero, as after every --resume), the PS's
        optimizer step."""
        rc = self.cfg.runtime
        self.span = span
        self.resuming, self.start_step, self.run_start = span.resuming, span.start, span.run_start
        self.total_steps, self.run_steps, self.periodic = span.end, span.run_end, span.periodic
        self.example_cost = rc.example_cost_us * 1e-6
        bw = rc.bandwidth_gbps * 1e9 / 8
        self.shard_links = [Link(f"emb-ps-{s}", bw) for s in range(rc.ps_shards)]
        self.bandwidth = (rc.sync_bandwidth_gbps * 1e9 / 8) if rc.sync_bandwidth_gbps > 0 else bw
        self.dense_link = Link("sync-ps", self.bandwidth)  # dense bandwidth: also all-reduce
        for shard in self.ps.shards:  # the sparse optimizer's step goes on from the checkpoint
            if shard.tables and self.start_step:  # (a new shard's is 0; under Ray a set costs
                shard.step = self.start_step      # a snapshot of its tables)
        # The PS owns the tables from here (its shards made their own copies): the engine keeps
        # the dense state only, or the host would hold every table twice (dlrm_kaggle: 1.1 GB).
        self.init_state = state._replace(tables={}, slots={})
        self.own = self.counts = self.report = None  # the algorithm's, for this interval
        self.carry = None  # what `finish` leaves the next interval (`next_interval`)

    def next_interval(self) -> bool:
        """After `finish`: go on to the run's next checkpoint interval from the state just
        checkpointed, in memory (the data, placement, PS and compiled functions stay), or
        False: the run is over."""
        if self.carry is None:
            return False
        state, own = self.carry
        self.t0 = time.perf_counter()
        self._begin(segments.next_span(self.cfg, self.span, int(state.step), self.num_workers),
                    state)
        self.carry_own = own
        self.placement.end_interval()
        return True

    def _compile(self, state: TrainState, warm_batch: tuple) -> None:
        """Build every jitted piece of the workers and run it once on `warm_batch` before any
        thread starts (compiling holds the GIL: PERF_NOTES 5)."""
        grads, grads_rows = make_grads(self.mini_layout, self.mini_model)
        self.grads = jax.jit(grads)
        self.grads_rows = jax.jit(grads_rows)
        self.dense_apply = jax.jit(lambda p, o, g: apply_dense(self.tx, p, o, g))
        self.dense_bytes = sum(int(x.size) * 4 for x in jax.tree.leaves(state.params))
        local, rows = self.warm_batch = warm_batch
        _, g, rg = self.grads(state.params, self.ps.pull(rows, admit=False), local)
        jax.block_until_ready(self.dense_apply(state.params, state.opt_state, g))
        self.ps.warm(rows, rg)

    # -- data --------------------------------------------------------------------------------
    def localize(self, batch) -> tuple:
        """``(batch with ids remapped to the rows it touches, rows)`` (`ps.localize`)."""
        return ps_lib.localize(self.model.layout, batch)

    def static_shards(self) -> StaticShards:
        """Per-worker shards of this call's steps (`supply.Feed.static_shards`)."""
        return self.feed.static_shards(self.num_workers, self.start_step, self.total_steps,
                                       self.periodic, self.localize)

    def shared_list(self, m: int, localize: bool = True,
                    index=None) -> SharedList | ListOfIndices:
        """GBA's data list: M entries of ``B_a`` rows per global step, from the resumed step.

        With ``localize=False`` the entries are the batches as read (Persia's embedding workers
        localize the ids they receive themselves). Where the workers read their own data (the
        roles in the Ray actors), the list is its indices only, from `index` (a shared server
        with `supply.EntryIndex`'s ``next_entry``: GBA's PS0, Persia's pipeline), and each
        worker reads the entries it gets.

        Raises:
          ValueError: the workers read their own data and no `index` serves them.
        """
        if not self.placement.data_here:
            if index is None:
                raise ValueError("the workers read their own data here (their roles run in "
                                 "their Ray actors): the data list needs a shared server that "
                                 "hands out its indices (index=, e.g. GBA's PS0)")
            return ListOfIndices(index, m, localize)
        return self.feed.shared_list(m, self.start_step, self.total_steps,
                                     self.localize if localize else None)

    # -- state -------------------------------------------------------------------------------
    @property
    def base_counts(self) -> dict:
        """The algorithm's counters of the run before this call (the checkpoint's; those of
        another algorithm the run switched from are kept apart, under its own name)."""
        return self.progress.counts.get(self.cfg.train.algo, {})

    def restore_own(self, like: Any) -> Any:
        """The algorithm's own arrays (`own`) saved with the checkpoint this call starts from,
        structured like `like`; None for a fresh start or a checkpoint without them (another
        algorithm's, or of another topology: said on stderr)."""
        if not self.resuming:
            return None
        if self.carry_own is not None:  # the run's previous interval, in memory
            return self.carry_own
        return contract.restore_extra(self.ckpt, self.start_step, like, self.cfg.train.algo)

    def state(self, params: Any, opt_state: Any, step: int) -> TrainState:
        """A consistent `TrainState` at global `step` (call when no role runs)."""
        tables, slots = self.ps.snapshot()
        return TrainState(jnp.asarray(step, jnp.int32), params, opt_state, tables, slots)

    def close(self) -> None:
        """Close the checkpointer and stop the placement's processes; safe to repeat."""
        if self.ckpt is not None:
            self.ckpt.close()
            self.ckpt = None
        self.placement.close()

    # -- the run -----------------------------------------------------------------------------
    def execute(self, roles: list[RoleSpec], supply, snapshot=None, workers=(), counters=None,
                step=None, served=None) -> Schedule:
        """Run the roles (virtual clock with ``--deterministic``, else threads).

        Args:
          roles: every role of the run.
          supply: the batch supply (closed at the end).
          snapshot: ``() -> (params, opt_state, global step)`` to checkpoint on Ctrl-C and to
            evaluate every ``train.eval_every`` steps.
          workers: the `Worker`\\ s (their scored batches make the train records).
          counters: ``() -> dict`` of the algorithm's counters, recorded over time.
          step: ``() -> global step reached`` (default: start + the workers' iterations).
          served: ``() -> bytes each PS shard served`` (default: the workers' counters).
        """
        virtual, place = self.cfg.train.deterministic, self.placement
        self.report = report.Reporter(self, workers, step, snapshot, counters, served)
        # A role that makes no progress for runtime.watchdog_s is named, its stack printed, and
        # the run stopped with a checkpoint (issue 16, item 10); threads only: on the virtual
        # clock every role runs in this thread, between events.
        dog = Watchdog([r.name for r in roles], self.cfg.runtime.watchdog_s)
        if virtual:
            # Signals are read between events, never inside a role: the state stays whole. With
            # periodic checkpoints the first one lets the interval finish (its checkpoint keeps
            # the run bit-reproducible), a second one abandons the interval.
            stop_at = 2 if self.periodic else 1
            roles = [dataclasses.replace(r, role=stoppable(r.role, stop_at)) for r in roles]
        else:
            roles = [dataclasses.replace(r, role=dog.watch(i, r.role))
                     for i, r in enumerate(roles)]

        def on_poll():
            dog.check("recjax-rt-")
            place.check()
            self.report.on_poll()

        def on_event(now: float) -> bool:
            place.check()
            return self.report.on_event(now)

        self.report.on_wait = lambda: dog.check("recjax-rt-")

        try:
            if signals.requested() and not (virtual and self.periodic):
                raise KeyboardInterrupt  # a stop signal came while the run was being set up
            if virtual:
                return run_virtual(roles, on_event)
            place.warm(self.init_state.params, self.warm_batch,  # before the clock runs
                       getattr(supply, "shares", True))
            group = ThreadGroup("recjax-rt")
            self.report.bind(group.stop)
            roles = [dataclasses.replace(r, role=self.report.wrap(r.role)) for r in roles]
            sched = run_threaded(roles, group, self.cfg.runtime.emulate_links, on_poll,
                                 t0=self.report.start(),  # the records' origin is the run's
                                 poll_s=place.poll_s)
            sched.seconds -= self.report.paused  # evals and records are not training time
            return sched
        except BaseException as e:  # Ctrl-C, or a PS process gone for good: a checkpoint
            self.report.close()
            lost = place.diagnose(e)
            if isinstance(lost, Abandoned):
                last = self.ckpt.latest_step() if self.ckpt is not None else None
                print(f"stopped at once; the checkpoint at step {last} is the latest")
            elif isinstance(lost, StateLost):
                lost = finish.latest(self, lost)
            elif isinstance(lost, (*place.stop_saving, TimeoutError)):
                finish.save_stopped(self, snapshot, workers, "interrupted"
                                    if isinstance(lost, KeyboardInterrupt) else "stopped")
            self.close()
            if lost is e:
                raise
            raise lost from e
        finally:
            supply.close()

    def finish(self, params: Any, opt_state: Any, sched: Schedule, workers: list[Worker],
               extra: dict, step: int | None = None) -> dict:
        """Eval the returned model, checkpoint, write metrics.jsonl and summary.json
        (``finish.py``); at an interval's end, the interval's checkpoint and records only.

        Args:
          extra: the algorithm's counters for the summary.
          step: the global step reached (default: start + the workers' iterations, one global
            step each).
        """
        return finish.finish(self, params, opt_state, sched, workers, extra, step)
