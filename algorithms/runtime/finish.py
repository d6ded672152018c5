"""The end of a call of a host-async run's roles: the checkpoint a stop leaves, and the end of
an interval or of the run (evaluation, checkpoint, metrics.jsonl, summary.json).

`finish` is `engine.Runtime.finish`; `save_stopped` checkpoints the roles' state after they
stopped early (Ctrl-C, a lost PS); `totals` sums the batches the workers scored (Train NE);
`predictor` is what evaluation calls. The run contract (``--out`` policy, Train NE across
intervals, eval, summary) is `recjax.train.contract`, shared with every other trainer.
"""

from __future__ import annotations

import time
from typing import Any

import jax.numpy as jnp

from algorithms.runtime import ps as ps_lib
from algorithms.runtime.clock import Schedule
from algorithms.runtime.segments import StateLost, with_latest
from algorithms.runtime.worker import Worker, mini_layout
from recjax import checkpoint_parts
from recjax.train import contract
from recjax.train.step import Model, StepMetrics, TrainState, jit_predict

Runtime = Any  # `engine.Runtime` (not imported: the engine imports this module)


def totals(workers: list[Worker], completed: bool = False) -> dict:
    """StepMetrics sums of the batches the workers scored (`completed`: only those of
    iterations they completed, as at a step the roles were stopped at early)."""
    ms = [m for w in workers
          for m in w.counters.metrics[:w.counters.iterations if completed else None]]
    return contract.sum_metrics(ms) if ms else dict.fromkeys(StepMetrics._fields, 0.0)


def pulls(rt: Runtime) -> bool:
    """Evaluation looks each batch's rows up through the PS (an LRU store, or tables that
    live in the PS's actors) instead of reading whole tables in this process."""
    return rt.ps.lru or not rt.placement.tables_here


def predictor(rt: Runtime):
    """``(params, tables, batch) -> logits`` for eval: the full tables, or (`pulls`) the rows
    looked up through the PS without admitting anything: the same rows, so the same logits,
    with no table gathered into this process."""
    if not pulls(rt):
        return jit_predict(rt.model)
    model = Model(rt.model.module, mini_layout(rt.model.layout, rt.cfg.train.eval_batch_size,
                                               rt.max_len), rt.model.microbatches)
    pred = jit_predict(model)

    def predict(params, _tables, batch):
        local, rows = ps_lib.localize(rt.model.layout, batch)
        return pred(params, rt.ps.pull(rows, admit=False), local)

    return predict


def take_counts(rt: Runtime) -> None:
    """Before a checkpoint: the progress takes the run's counters so far (this call's added
    to the checkpoint's, under the algorithm's name), once: `Runtime.counts` is spent."""
    if rt.counts is not None:
        algo = rt.cfg.train.algo
        rt.progress.counts = {**rt.progress.counts, algo: contract.add_counts(
            rt.progress.counts.get(algo, {}), rt.counts())}
        rt.counts = None


def own(rt: Runtime) -> Any:
    """The algorithm's own arrays for a checkpoint (`engine.Runtime.own`), or None."""
    return None if rt.own is None else rt.own()


def latest(rt: Runtime, e: StateLost) -> StateLost:
    """`e`, naming the run's latest committed checkpoint (an async save in flight first
    commits)."""
    if rt.ckpt is not None:
        rt.ckpt.close()
    return with_latest(e, rt.cfg.train.out)


def save_stopped(rt: Runtime, snapshot, workers: list[Worker], why: str) -> None:
    """Checkpoint the roles' state after they stopped early (Ctrl-C, a lost PS)."""
    if rt.ckpt is None or snapshot is None:
        return
    params, opt_state, step = snapshot()
    sums = totals(workers)
    contract.check_finite(sums, f"before step {step}", rt.ckpt)
    rt.progress.add(sums)
    if rt.report.stopper is not None:  # the best so far goes on after a --resume
        rt.progress.early_stop = rt.report.stopper.state()
    take_counts(rt)
    saved, parts = _to_save(rt, TrainState(jnp.asarray(step, jnp.int32), params, opt_state,
                                           {}, {}))
    contract.save(rt.ckpt, rt.cfg, saved, rt.progress, time.perf_counter() - rt.t0, own(rt),
                  parts=parts, interrupted=True)
    print(f"{why} at step {step}; checkpoint in {rt.cfg.train.out}")


def _to_save(rt: Runtime, state: TrainState) -> tuple[TrainState, list]:
    """``(the state a checkpoint saves, its parts)``: the tables the PS's actors write
    themselves (`Placement.parts`), left out of `state`; else every table in `state`,
    gathered now if it lacks them (a shard gone for good: its last snapshot)."""
    parts = rt.placement.parts()
    if parts:
        return checkpoint_parts.split(state, [n for p in parts for n in p.names])[0], parts
    if len(state.tables) < len(rt.model.layout.tables):
        state = rt.state(state.params, state.opt_state, int(state.step))
    return state, []


def finish(rt: Runtime, params: Any, opt_state: Any, sched: Schedule, workers: list[Worker],
           extra: dict, step: int | None = None) -> dict:
    """`engine.Runtime.finish`: eval the returned model, checkpoint, write the records."""
    cfg, tc = rt.cfg, rt.cfg.train
    try:  # roles that all ended on a dead raylet end here
        rt.placement.check(now=True)
    except StateLost as e:
        rt.close()
        raise latest(rt, e) from None
    except OSError:  # only GCS is gone: the actors' state is whole, finish as planned
        pass
    iterations = sum(w.counters.iterations for w in workers)
    report = rt.report
    if report.early is not None:  # early stopping ended the roles at an eval
        state, ev, preds = report.early
        step = int(state.step)
    else:
        step = rt.start_step + iterations if step is None else step
        state = state_at(rt, params, opt_state, step)
    sums = totals(workers, completed=report.early is not None)
    contract.check_finite(sums, f"in steps {rt.start_step + 1}-{step}", rt.ckpt)
    rt.progress.add(sums)
    wall = time.perf_counter() - rt.t0
    rt.progress.train_seconds += sched.seconds
    rt.progress.timed_steps += step - rt.start_step
    # the roles were to stop before the run's end: a checkpoint interval or stop_after (a
    # run that ends short because it lost a role is at its end: it gets its summary)
    at_end = report.early is not None or rt.total_steps >= rt.run_steps
    if at_end and report.early is None:  # the final eval counts for the best checkpoint
        ev, preds = contract.evaluate(cfg, rt.data, predictor(rt), state.params, state.tables)
        report.track(step, ev, state, rt.progress, final=True)  # rt.progress: this call's sums
    elif not at_end:  # an interval's end: the eval due there (mid-interval ones: `report`)
        ev = preds = None
        if tc.eval_every and step % tc.eval_every == 0 and step < rt.run_steps:
            ev, preds = contract.evaluate(cfg, rt.data, predictor(rt), state.params,
                                          state.tables)
            at_end = report.track(step, ev, state, rt.progress)  # early stop at the boundary
    if report.stopper is not None:
        rt.progress.early_stop = report.stopper.state()
    take_counts(rt)
    # read only where it is kept (a replica in a dead trainer's actor is gone: nothing asks)
    mine = own(rt) if rt.ckpt is not None or rt.periodic else None
    # tables that live in the PS's actors: each writes its own (`_to_save`)
    to_save = _to_save(rt, state) if rt.ckpt is not None else None
    if to_save is not None and not at_end:
        contract.save(rt.ckpt, cfg, to_save[0], rt.progress, wall, mine, parts=to_save[1])
    if not at_end:
        report.boundary(step, sched.seconds, ev, extra)
        if rt.periodic and step < (tc.stop_after or rt.run_steps):  # the run goes on from here
            rt.carry = (state._replace(tables={}, slots={}), mine)
            rt.progress.wall_seconds += wall  # as the checkpoint's progress holds it
        else:
            rt.close()
        return {"stopped_at": step, "steps": step}
    if rt.ps.lru:
        extra = {"lru": rt.ps.lru_counters(), **extra}
    extra = {"backend": rt.placement.name, "lost_roles": sched.lost, **extra}
    extra.update(rt.placement.fault_counters())
    if to_save is not None:  # nothing of the end is written for a state that cannot be saved
        contract.refuse_non_finite(rt.ckpt, to_save[0], mine)
    summary = contract.build_summary(
        cfg, rt.data, state, rt.progress, ev, start_step=rt.run_start,
        wall_seconds=rt.progress.wall_seconds + wall, train_seconds=rt.progress.train_seconds,
        timed_steps=rt.progress.timed_steps, clock="virtual" if tc.deterministic else "wall",
        extra={**_layout(rt, sched, step, iterations), **extra,
               **(report.stopper.summary() if report.stopper is not None else {})})
    report.final(step, sched.seconds, None if report.early is not None else ev, extra)
    contract.write_summary(cfg, summary, preds)
    # the final checkpoint after the summary: a kill in between leaves the one before, which a
    # --resume continues to the end (a resume from a checkpoint at the run's end only
    # evaluates it and writes the summary again, the step's checkpoint kept as it is)
    try:
        if to_save is not None:
            contract.save(rt.ckpt, cfg, to_save[0], rt.progress, wall, mine, parts=to_save[1],
                          checked=True)
    finally:
        rt.close()
    return summary | {"final_state": state, "schedule": sched}


def state_at(rt: Runtime, params: Any, opt_state: Any, step: int) -> TrainState:
    """The `TrainState` at `step` for an eval's out/best or the call's end: with every table
    (`rt.state`) where this process holds them or needs them (`_gather`), else without."""
    if _gather(rt):
        return rt.state(params, opt_state, step)
    return TrainState(jnp.asarray(step, jnp.int32), params, opt_state, {}, {})


def save_best(rt: Runtime, ckpt, state: TrainState, progress, wall: float) -> None:
    """Write `state` to out/best (`ckpt`): its tables as the checkpoints' are (`_to_save`),
    by the shard actors where they live there, as they are now."""
    saved, parts = _to_save(rt, state)
    contract.save(ckpt, rt.cfg, saved, progress, wall, parts=parts)


def _gather(rt: Runtime) -> bool:
    """The end of the call needs every table in this process: the returned ``final_state``
    holds them (``Placement.final_tables``); else, under Ray, the tables (an LRU store's too)
    stay in their shard actors: evaluation pulls rows (`pulls`) and each actor writes its own
    part of a checkpoint and of out/best (`Placement.parts`)."""
    return rt.placement.tables_here or rt.placement.final_tables


def _layout(rt: Runtime, sched: Schedule, step: int, iterations: int) -> dict:
    """The summary's account of the engine: rates, topology, PS bytes and placement."""
    rc, tc = rt.cfg.runtime, rt.cfg.train
    shard = rt.report.served()
    return {
        "segment_seconds": sched.seconds,
        "segment_examples_per_sec": (step - rt.start_step) * tc.batch_size
        / max(sched.seconds, 1e-12),
        "worker_iterations": iterations, "worker_batch_size": rt.batch_size,
        "trainers": rc.trainers, "workers_per_trainer": rc.workers_per_trainer,
        "stragglers": rc.stragglers,
        "embedding_bytes": int(sum(shard)), "embedding_bytes_per_shard": shard,
        "ps_placement": rc.placement, "ps_table_to_shard": rt.ps.placement,
        "ps_load_profile": {how: ps_lib.shard_loads(rt.costs, ps_lib.place(
            rt.costs, rc.ps_shards, how), rc.ps_shards) for how in ("mod", "binpack")},
        "virtual_events": sched.events if tc.deterministic else None}
