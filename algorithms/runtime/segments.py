"""A host-async run from checkpoint to checkpoint (``train.ckpt_every``), and the stop
signals of its roles (issue 16, item 5).

`run_in_segments` calls an algorithm once per checkpoint interval; `SEGMENT` tells the
interval's `engine.Runtime` where the run started; `open_segment` opens the interval's
checkpoints and says where its roles start and stop (`Span`); `stoppable` wraps a role of the
virtual clock so that stop signals end it between events.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from typing import NamedTuple

from recjax import registry
from recjax.config import Config
from recjax.train import contract, signals
from recjax.train.step import TrainState

# The step a run of several checkpoint intervals started at (`run_in_segments` sets it while it
# calls the algorithm for the second interval on; None: the call is the run's first).
SEGMENT: contextvars.ContextVar[int | None] = contextvars.ContextVar("recjax_segment", default=None)

HOST_ASYNC = registry.names(kind=registry.HOST_ASYNC)  # the algorithms that run on this engine


class Span(NamedTuple):
    """Where the roles of one call of an algorithm start and stop, in global steps.

    Attributes:
      resuming: the call goes on from a checkpoint (``--resume``, or the run's previous
        interval).
      start: the step the state is at.
      run_start: the step the run (every interval of it) started at.
      end: the step the roles of this call stop at (`segment_end`).
      run_end: the run's last step (``train.steps``, or ``train.epochs`` of the data).
      periodic: checkpoints every ``train.ckpt_every`` steps (`run_in_segments`).
    """

    resuming: bool
    start: int
    run_start: int
    end: int
    run_end: int
    periodic: bool


def open_segment(cfg: Config, state: TrainState, workers: int, steps_per_epoch: int):
    """The checkpoints of this call and where its roles start and stop: ``(checkpointer or
    None, the state to start from, progress, Span)`` (`contract.open_run`'s policy).

    Raises:
      ValueError: a resumed run whose checkpoint already reaches the requested steps.
    """
    tc = cfg.train
    run_start = SEGMENT.get()  # set when this goes on from the run's periodic checkpoint
    resuming = tc.resume or run_start is not None
    ckpt, state, progress = contract.open_run(cfg, state, resume=resuming)
    start = int(state.step)
    run_end = tc.steps or tc.epochs * steps_per_epoch
    if tc.resume and start >= run_end:
        raise ValueError(f"the checkpoint is at step {start}, which already reaches the "
                         f"requested {run_end} steps; raise --steps (or --epochs) to go on")
    periodic = bool(tc.ckpt_every and ckpt is not None)
    end = segment_end(cfg, start, run_end, workers, periodic)
    return ckpt, state, progress, Span(resuming, start, start if run_start is None else run_start,
                                       end, run_end, periodic)


def segment_end(cfg: Config, start: int, run_end: int, workers: int, periodic: bool) -> int:
    """The step the roles run to: the run's last step, ``train.stop_after``, or with periodic
    checkpoints the next multiple of ``train.ckpt_every`` (a tail shorter than the workers
    joins the interval before it, so every worker gets a batch)."""
    tc, end = cfg.train, run_end
    if periodic:
        k = tc.ckpt_every
        nxt = (start // k + 1) * k
        if end - nxt >= workers:
            end = nxt
    if start < tc.stop_after < end:
        end = tc.stop_after
    return end


class StateLost(OSError):
    """A process that holds part of the run's state and is not restarted died (under Ray: the
    raylet, or a hosted server's actor): the run stops without a checkpoint; the engine adds
    which committed checkpoint is the latest."""


def with_latest(e: StateLost, out: str) -> StateLost:
    """`e`, its message naming the run's latest committed checkpoint (what survives it)."""
    steps = contract.committed_steps(os.path.join(out, "checkpoints")) if out else []
    where = (f"the latest committed checkpoint is step {steps[-1]} in {out}: continue from it "
             "with --resume") if steps else "the run has no committed checkpoint"
    return StateLost(f"{e}; {where}")


class Abandoned(KeyboardInterrupt):
    """A second stop signal on the virtual clock: the interval is dropped, not checkpointed."""


def stoppable(role, stop_at: int):
    """`role`, ending the run (KeyboardInterrupt) before its next event once `stop_at` stop
    signals have come; a second signal abandons without a checkpoint (`Abandoned`)."""
    value = None
    try:
        while True:
            n = signals.requested()
            if n >= stop_at:
                raise Abandoned() if stop_at == 2 else KeyboardInterrupt()
            try:
                effect = role.send(value)
            except StopIteration:
                return
            value = yield effect
    finally:
        role.close()


def run_in_segments(run: Callable[[Config], dict], cfg: Config) -> dict:
    """Run a host-async algorithm from checkpoint to checkpoint (issue 16, item 5).

    With ``--train.ckpt_every=K`` and ``--out``, each call of `run` builds the roles afresh
    from the latest checkpoint, runs them to the next multiple of K, where every role has
    stopped (a step boundary, nothing in flight), and checkpoints there (`Runtime.finish`); the
    next call goes on from it exactly as ``--resume`` would. A run with checkpoints is thus the
    chain of its own resumptions, and with ``--deterministic`` a run killed at any moment and
    resumed equals the uninterrupted one bit for bit. What an algorithm keeps beyond the train
    state goes into the checkpoint with it (`Runtime.own`: ShadowSync's replicas, wPS, BMUF
    states and its counters), so the next interval goes on from it as it was; what lives only
    in the roles restarts at each checkpoint, as on every ``--resume``: the virtual clock and
    the links from zero, FR's sync-gap count. The summary's counters are the whole run's: each
    checkpoint's progress carries the additive ones (`Runtime.counts`, `contract.add_counts`).

    Signals: in threads the first SIGINT/SIGTERM stops the roles and checkpoints their state
    (`Runtime.execute`); on the virtual clock it lets the interval finish and checkpoint, and a
    second one abandons the interval, keeping the checkpoint before it.
    """
    with signals.stop_requests(raise_on_second=False) as stop:
        start = None
        while True:
            token = SEGMENT.set(start)
            try:
                out = run(cfg)
            finally:
                SEGMENT.reset(token)
            if not out.pop("next_segment", False):
                out.pop("run_start", None)
                return out
            start = out["run_start"]
            if stop.count:
                print(f"stopped at step {out['steps']}; resume with --resume --out "
                      f"{cfg.train.out}")
                raise KeyboardInterrupt
