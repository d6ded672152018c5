"""Training algorithms, one module each, dispatched by `--algo` (DESIGN.md section 5).

Which algorithms exist, of which kind, and what each supports is `recjax.registry`; each row's
``run`` (``"module:function"``, imported when the algorithm runs) is ``run(cfg) -> summary
dict``. SPMD algorithms pass a `recjax.train.loop.Strategy` to the shared trainer; host-async
ones drive the runtime.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from algorithms.runtime import placement
from algorithms.runtime.segments import with_latest
from recjax import registry
from recjax.config import Config


def runner(name: str) -> Callable[[Config], dict]:
    """The ``run`` of algorithm `name` (its registry row's ``"module:function"``)."""
    module, _, fn = registry.REGISTRY[name].run.partition(":")
    return getattr(importlib.import_module(module), fn)


RUNNERS: dict[str, Callable[[Config], dict]] = {  # every --algo; each imports its module on call
    name: (lambda cfg, name=name: runner(name)(cfg)) for name in registry.NAMES}


def run(cfg: Config) -> dict:
    """Run `cfg.train.algo` after refusing what it cannot honour (`registry.check`); with
    ``data.eval_protocol=next_day``, one resumed run per day (`recjax.train.days`)."""
    if cfg.data.eval_protocol == "next_day":  # each day's run has protocol "final"
        from recjax.train import days

        return days.run_days(cfg, run)
    if cfg.train.algo == "single" and cfg.train.devices > 1:
        raise ValueError(f"--algo single trains on one device; for --devices {cfg.train.devices} "
                         f"use --algo {' or '.join(registry.names(kind=registry.SPMD))}")
    registry.check(cfg)
    cfg = placement.settle(cfg)
    try:
        return RUNNERS[cfg.train.algo](cfg)
    except BaseException as e:  # a process the run needs died: say which, not Ray's error
        lost = placement.lost(e)
        if lost is e:
            raise
        raise with_latest(lost, cfg.train.out) from e
    finally:  # whatever happened, no Ray process of this run outlives it
        placement.shutdown()
