"""A host-async run from checkpoint to checkpoint (``train.ckpt_every``), and the stop
signals of its roles (issue 16, item 5).

`run_in_segments` calls an algorithm once per checkpoint interval; `SEGMENT` tells the
interval's `engine.Runtime` where the run started; `stoppable` wraps a role of the virtual
clock so that stop signals end it between events.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable

from recjax import registry
from recjax.config import Config
from recjax.train import contract, signals

# The step a run of several checkpoint intervals started at (`run_in_segments` sets it while it
# calls the algorithm for the second interval on; None: the call is the run's first).
SEGMENT: contextvars.ContextVar[int | None] = contextvars.ContextVar("recjax_segment", default=None)

HOST_ASYNC = registry.names(kind=registry.HOST_ASYNC)  # the algorithms that run on this engine


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
    resumed equals the uninterrupted one bit for bit. What lives only in the roles restarts at
    each checkpoint, as on every ``--resume``: ShadowSync's replicas from their mean, the
    virtual clock and the links from zero; summary counters cover the last interval.

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
