"""The single-device trainer, read top to bottom: data -> state -> jitted steps -> eval -> files.

    summary = run(cfg)

Data order is a pure function of (seed, epoch), so a run resumed from the checkpoint at step k
replays exactly the batches an uninterrupted run would have seen from step k on; together with
XLA:CPU's deterministic kernels this makes resumed runs bitwise equal to uninterrupted ones
(tests/test_train.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

import jax

from recjax.batch import Batch
from recjax.concurrency import Prefetcher
from recjax.config import Config
from recjax.data.pipeline import batches
from recjax.data.seek import seekable
from recjax.train import contract, signals
from recjax.train.data import RunData, block_batches, open_data, process_rows, train_shuffle_buffer
from recjax.train.hooks import RunOutputs
from recjax.train.setup import build
from recjax.train.step import StepMetrics, TrainState, eval_params, jit_predict, jit_train_step


class Strategy(Protocol):
    """How a run executes its steps: the single-device default, or an SPMD algorithm's.

    `run` owns data, logging, eval, checkpoints and the summary; a strategy owns placement and
    the jitted functions. Algorithms (``algorithms/``) implement this to reuse the trainer.
    """

    name: str

    def prepare(self, state: Any) -> Any:
        """Place a freshly built or restored state where the steps expect it."""
        ...

    def put_batch(self, batch: Batch) -> Any:
        """Host batch -> device batch (runs in the prefetch thread)."""
        ...

    def train_step(self, state: Any, batch: Any) -> tuple[Any, StepMetrics]: ...

    def predict(self, params: Any, tables: dict, batch: Batch) -> jax.Array: ...

    def unshard(self, state: Any) -> TrainState:
        """The state in the single-device layout: what checkpoints hold, so that any algorithm
        can resume (or start from) any other's checkpoint."""
        ...

    def summary(self) -> dict:
        """The algorithm's own counters for summary.json (e.g. comm_bytes_per_step)."""
        ...

    # Optional: a strategy whose state holds more than the single-device layout (DiLoCo's
    # replicas and outer momentum) defines ``extra(state) -> pytree | None`` (arrays checkpointed
    # beside `unshard`'s, `recjax.checkpoint.Checkpointer.save`), ``extra_like(state) -> pytree``
    # (their structure for a `TrainState` of this run) and takes them back in
    # ``prepare(state, extra)`` (None: a checkpoint without them, e.g. another algorithm's).


def restore_extra(strategy, ckpt, state: TrainState):
    """The strategy's own arrays saved with the checkpoint `state` was restored from, or None
    (no such strategy, a fresh run, a checkpoint without them, or of another shape)."""
    if ckpt is None or int(state.step) == 0 or not hasattr(strategy, "extra"):
        return None
    return contract.restore_extra(ckpt, int(state.step), strategy.extra_like(state),
                                  strategy.name)


class SingleDevice:
    """The reference strategy: one device, `train_step` jitted with the state donated."""

    name = "single"

    def __init__(self, model, tx, sparse_opt):
        self.train_step = jit_train_step(model, tx, sparse_opt)
        self.predict = jit_predict(model)

    def prepare(self, state):
        return jax.device_put(state)

    def put_batch(self, batch: Batch):
        return jax.device_put(batch)

    def unshard(self, state):
        return state

    def summary(self) -> dict:
        return {}


def train_batches(cfg: Config, data: RunData, start_step: int, total_steps: int,
                  steps_per_epoch: int, rows: slice | None = None) -> Iterator[Batch]:
    """Training batches for steps [start_step, total_steps): epoch e is shuffled by (seed, e).

    A resumed run starts at its step's batch of its epoch without reading the examples of the
    batches before it (`recjax.data.seek`; a source that cannot seek is read and skipped).
    With `rows` (a multi-process run: `process_rows`), a seekable source reads only those rows
    of each batch, this process's block (`block_batches`)."""
    step = start_step
    epoch, skip = divmod(start_step, steps_per_epoch)
    buffer = train_shuffle_buffer(data, cfg.data.shuffle_buffer)
    block = rows is not None and seekable(data.train)
    while step < total_steps:
        order = dict(seed=cfg.train.seed, epoch=epoch, shuffle_buffer=buffer, keep=data.keep_train)
        stream = (block_batches(data.train, cfg.train.batch_size, rows, start=skip, **order)
                  if block else
                  (b for b, _ in batches(data.train, cfg.train.batch_size, drop_remainder=True,
                                         start=skip, **order)))
        for batch in stream:
            yield batch
            step += 1
            if step >= total_steps:
                return
        epoch, skip = epoch + 1, 0


@signals.graceful  # SIGINT/SIGTERM stop at the next step boundary, with a checkpoint
def run(cfg: Config, make_strategy=None, checkpoints=True, agree=None) -> dict:
    """Train and evaluate as `cfg` says; returns (and with --out writes) the summary dict.

    Args:
      cfg: the run's config.
      make_strategy: ``(cfg, model, tx, sparse_opt) -> Strategy``; default `SingleDevice`.
      checkpoints: write checkpoints/ under ``--out`` (False: summary, metrics and predictions
        only); or ``() -> Checkpointer``, the checkpointer every process of a multi-process run
        builds (`sharding.spmd`: it saves ``strategy.logical(state)``, global arrays).
      agree: ``(bool) -> bool``, whether any process asks to stop (a multi-process run: every
        process calls it between steps, so all stop at the same step and save it together).
        A second signal stops this process at once, without a checkpoint: the others are not
        at the same point to write one with it.
    """
    t0 = time.perf_counter()
    tc = cfg.train
    data = open_data(cfg)
    model, tx, sparse_opt, state = build(cfg, data.spec)
    steps_per_epoch = data.train_rows // tc.batch_size
    total_steps = tc.steps or tc.epochs * steps_per_epoch

    ckpt, state, progress = contract.open_run(cfg, state, checkpoints)
    start_step = int(state.step)
    if tc.resume and start_step > total_steps:  # (at them: trains nothing, evaluates it)
        raise ValueError(f"the checkpoint is at step {start_step}, past the requested "
                         f"{total_steps} steps; raise --steps (or --epochs) to go on")
    strategy = (make_strategy or (lambda c, *a: SingleDevice(*a)))(cfg, model, tx, sparse_opt)
    if hasattr(strategy, "extra"):  # a strategy with state of its own (see `Strategy`)
        state = strategy.prepare(state, restore_extra(strategy, ckpt, state))
    else:
        state = strategy.prepare(state)
    step_fn, predict = strategy.train_step, strategy.predict
    extra = getattr(strategy, "extra", lambda state: None)

    stop_at = min(total_steps, tc.stop_after) if tc.stop_after else total_steps
    # the bar, records, their cadence and the early stopper, as the host-async engine has them
    out = RunOutputs(cfg, start_step, total_steps, checkpoints, progress.early_stop,
                     tc.resume, f"{cfg.model.name} on {cfg.data.train}")
    stopper = out.stopper

    window: list[StepMetrics] = []
    t_first = t_log = None  # end of the first (compiling) step; start of the current log window
    paused = 0.0  # seconds spent in in-loop evals and checkpoints since t_first
    step, first_step, interrupted = start_step, start_step, False
    hard = False  # a second signal: this process stops now (`agree`)
    alone = agree is not None  # a multi-process run: a hard stop leaves the others behind

    def save(at: int) -> None:
        nonlocal window, paused
        t = time.perf_counter()
        if window:  # fold pending Train-NE sums in, so the checkpoint carries all of them
            progress.add(contract.sum_metrics(window, step, ckpt))
            window = []
        progress.train_seconds = train_seconds_before + (t - t_first - paused if t_first else 0.0)
        progress.timed_steps = timed_before + (at - first_step if t_first else 0)
        progress.early_stop = stopper.state() if stopper is not None else None
        view = strategy.logical if getattr(ckpt, "sharded", False) else strategy.unshard
        contract.save(ckpt, cfg, view(state), progress, t - t0, extra(state))
        paused += time.perf_counter() - t

    train_seconds_before, timed_before = progress.train_seconds, progress.timed_steps
    epoch_ckpts = contract.epoch_checkpoints(total_steps)
    last_eval: tuple = (-1, None, None)  # (step, metrics, predictions) of the latest mid-run eval

    def save_best(best_ckpt) -> None:
        nonlocal paused
        t = time.perf_counter()
        contract.save(best_ckpt, cfg, strategy.unshard(state), progress, t - t0)
        paused += time.perf_counter() - t

    rows = process_rows(strategy, tc.batch_size)  # None but in a multi-process run
    prefetch = Prefetcher(train_batches(cfg, data, start_step, stop_at, steps_per_epoch, rows),
                          depth=cfg.data.prefetch, transform=strategy.put_batch)
    try:
        for batch in prefetch:
            state, m = step_fn(state, batch)
            window.append(m)
            step += 1
            if t_first is None:  # the first step includes compilation: time from its end
                jax.block_until_ready(m.loss)
                t_first = t_log = time.perf_counter()
                first_step, log_from = step, step
            if out.logs.due(step, stop_at) or step == stop_at:
                s = contract.sum_metrics(window, step, ckpt) if window else None
                now = time.perf_counter()
                rate = (step - log_from) * tc.batch_size / max(now - t_log, 1e-9)
                if s is not None:
                    progress.add(s)
                    out.train_record(step, steps_per_epoch, s, progress.totals, rate,
                                     progress.wall_seconds + now - t0)
                out.progress(step)
                out.logs.done(step)
                window, t_log, log_from = [], time.perf_counter(), step
            if out.evals.due(step, stop_at):
                t = time.perf_counter()
                ev, preds = contract.evaluate(cfg, data, predict, eval_params(state), state.tables)
                out.eval_record(step, ev)
                out.evals.done(step)
                last_eval = (step, ev, preds)
                paused += time.perf_counter() - t
                stop_here = out.track(step, ev, save_best)
                t_log = time.perf_counter()
                if stop_here:
                    break
            if ckpt and step < stop_at and ((tc.ckpt_every and step % tc.ckpt_every == 0)
                                            or (epoch_ckpts and step % steps_per_epoch == 0)):
                save(step)
                t_log = time.perf_counter()
            asked = bool(signals.requested())  # read between steps: the state is whole
            if agree(asked) if agree is not None else asked:
                interrupted = True
                break
    except KeyboardInterrupt:
        interrupted = hard = True
    finally:
        prefetch.close()
        out.bar.close()
    t_train_end = time.perf_counter()
    seg_seconds = t_train_end - t_first - paused if t_first else 0.0
    early = stopper is not None and stopper.stopped_at is not None
    finished = not interrupted and (step >= total_steps or early)
    if finished:  # the final eval counts for the best before the checkpoint records the best
        if early and last_eval[0] == step:  # the eval that stopped the run is the final one
            _, ev, preds = last_eval
        else:
            ev, preds = contract.evaluate(cfg, data, predict, eval_params(state), state.tables)
            out.eval_record(step, ev)
            out.track(step, ev, save_best, final=True)
        paused += time.perf_counter() - t_train_end
    if ckpt and step > start_step and not (hard and alone):
        try:  # state is between steps here: a consistent point to save
            save(step)
        except RuntimeError as e:  # a second signal inside a dispatch: the donated state is gone
            last = ckpt.latest_step()
            print(f"could not checkpoint step {step} ({str(e).splitlines()[0]}); "
                  + (f"the last checkpoint is step {last}" if last is not None
                     else "no checkpoint was written"))
    elif window:
        progress.add(contract.sum_metrics(window, step, ckpt))
    if not finished:
        if ckpt and not (hard and alone):
            ckpt.close()
        out.close()
        # without checkpoints (no --out, or a multi-process run) there is nothing to resume
        print(f"stopped at step {step}/{total_steps}"
              + (f"; resume with --resume --out {tc.out}" if ckpt and tc.out else ""))
        if interrupted:
            raise KeyboardInterrupt
        return {"stopped_at": step, "steps": step}

    if counters := strategy.summary():  # the algorithm's counters, as host-async runs record them
        out.counters_record(step, counters)
    final = strategy.unshard(state)
    summary = contract.build_summary(
        cfg, data, final, progress, ev, start_step=start_step,
        wall_seconds=progress.wall_seconds + time.perf_counter() - t0,
        train_seconds=train_seconds_before + seg_seconds,
        timed_steps=timed_before + (step - first_step if t_first else 0),
        last_loss=float(jax.device_get(m.loss)) if step > start_step else None,
        extra=strategy.summary() | (stopper.summary() if stopper is not None else {}))
    contract.write_summary(cfg, summary, preds)
    if ckpt:
        ckpt.close()
    out.close()
    return summary | {"final_state": state}

