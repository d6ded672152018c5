"""A host-async run, checkpoint interval by checkpoint interval, on one `engine.Runtime`
(issue 16, item 5; issue 34: checkpoints without tearing the run down).

An algorithm writes what one interval does (build its roles and servers from the runtime's
state, `Runtime.execute`, `Runtime.finish`) and hands it to `run`:

    def run(cfg):
        return intervals.run(cfg, cfg.runtime.hogwild_workers, interval)

With ``--train.ckpt_every=K`` and ``--out``, each interval's roles run to the next multiple of
K, where every role has stopped (a step boundary: nothing in flight, every push applied), and
`Runtime.finish` checkpoints there; the next interval goes on from that state *in memory*: the
data, the placement (Ray's processes, the PS shards with their tables), the compiled functions
and the checkpointer stay; only the roles and what the algorithm builds around them are made
again. What an algorithm keeps beyond the train state goes into the checkpoint with it
(`Runtime.own`: ShadowSync's replicas, wPS, BMUF states and its counters) and is handed to the
next interval as the checkpoint holds it (`Runtime.restore_own`). What lives only in the roles
restarts at each checkpoint, as on every ``--resume``: the virtual clock and the links from
zero, the workers' iteration counts (and the straggler draws keyed by them), FR's sync-gap
count. So an interval goes on exactly as a ``--resume`` from its checkpoint would, and with
``--deterministic`` a run killed at any moment and resumed equals the uninterrupted one bit for
bit (tests/test_intervals.py). The summary's counters are the whole run's: each checkpoint's
progress carries the additive ones (`Runtime.counts`, `contract.add_counts`).

Signals: in threads the first SIGINT/SIGTERM stops the roles and checkpoints their state
(`Runtime.execute`); on the virtual clock it lets the interval finish and checkpoint, and a
second one abandons the interval, keeping the checkpoint before it.
"""

from __future__ import annotations

from collections.abc import Callable

from algorithms.runtime.engine import Runtime
from recjax.config import Config
from recjax.train import signals


def run(cfg: Config, num_workers: int, interval: Callable[[Runtime], dict],
        batch_size: int = 0) -> dict:
    """Build the run's `Runtime` once and call ``interval(rt)`` for each checkpoint interval;
    returns the last call's result (the summary).

    Args:
      cfg: the run's config.
      num_workers, batch_size: `Runtime`'s.
      interval: one interval of the algorithm; it returns `Runtime.finish`'s result.
    """
    with signals.stop_requests(raise_on_second=False) as stop:
        rt = Runtime(cfg, num_workers, batch_size)
        try:
            while True:
                out = interval(rt)
                if rt.carry is None:  # the run's end (or --train.stop_after)
                    return out
                if stop.count:  # a signal came during the interval: it is checkpointed
                    print(f"stopped at step {out['steps']}; resume with --resume --out "
                          f"{cfg.train.out}")
                    raise KeyboardInterrupt
                rt.next_interval()
        finally:
            rt.close()
