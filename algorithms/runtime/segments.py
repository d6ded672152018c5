"""Where a host-async run's checkpoint intervals (``train.ckpt_every``) start and stop, and
the stop signals of its roles (issue 16, item 5).

`open_segment` opens the run's checkpoints and says where its first interval's roles start and
stop (`Span`); `next_span` where the next interval's do (``intervals.py`` runs them, one
`engine.Runtime` for all); `stoppable` wraps a role of the virtual clock so that stop signals
end it between events.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from recjax import registry
from recjax.config import Config
from recjax.train import contract, signals
from recjax.train.step import TrainState

HOST_ASYNC = registry.names(kind=registry.HOST_ASYNC)  # the algorithms that run on this engine


class Span(NamedTuple):
    """Where the roles of one checkpoint interval start and stop, in global steps.

    Attributes:
      resuming: the interval goes on from a checkpoint (``--resume``, or the run's previous
        interval).
      start: the step the state is at.
      run_start: the step this process's run (every interval of it) started at.
      end: the step the interval's roles stop at (`segment_end`).
      run_end: the run's last step (``train.steps``, or ``train.epochs`` of the data).
      periodic: checkpoints every ``train.ckpt_every`` steps (``intervals.py``).
    """

    resuming: bool
    start: int
    run_start: int
    end: int
    run_end: int
    periodic: bool


def open_segment(cfg: Config, state: TrainState, workers: int, steps_per_epoch: int,
                 loader=None):
    """The run's checkpoints and where its first interval's roles start and stop:
    ``(checkpointer or None, the state to start from, progress, Span)`` (`contract.open_run`'s
    policy; a resume's tables read by `loader`'s holders, `recjax.checkpoint_parts.Loader`).

    Raises:
      ValueError: a resumed run whose checkpoint is past the requested steps (one at them
        trains nothing: its roles end at once, and the run's end evaluates it and writes the
        summary, as the single trainer does).
    """
    tc = cfg.train
    ckpt, state, progress = contract.open_run(cfg, state, resume=tc.resume, loader=loader)
    start = int(state.step)
    run_end = tc.steps or tc.epochs * steps_per_epoch
    if tc.resume and start > run_end:
        raise ValueError(f"the checkpoint is at step {start}, past the requested {run_end} "
                         "steps; raise --steps (or --epochs) to go on")
    periodic = bool(tc.ckpt_every and ckpt is not None)
    end = segment_end(cfg, start, run_end, workers, periodic)
    return ckpt, state, progress, Span(tc.resume, start, start, end, run_end, periodic)


def next_span(cfg: Config, span: Span, step: int, workers: int) -> Span:
    """Where the interval after `span` runs: from `step` (the checkpoint `span`'s interval
    ended with) to the next checkpoint, or the run's end."""
    return span._replace(resuming=True, start=step,
                         end=segment_end(cfg, step, span.run_end, workers, span.periodic))


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
