"""Fully asynchronous parameter server (Downpour SGD / Hogwild): the ShadowSync baseline.

Dean et al., "Large Scale Distributed Deep Networks" (NeurIPS 2012), Downpour SGD; Recht et al.,
Hogwild! (2011). Every worker (``--trainers n --workers-per-trainer m`` gives n*m of them)
loops: pull the dense params from the dense PS (`ps.DensePS`) and the touched rows from the
embedding PS, compute gradients, push both; each PS applies every gradient as soon as it
arrives (dense: the run's optax optimizer; rows: the run's sparse optimizer), so gradients are
stale by the pushes that landed in between (reported as a staleness histogram). Dense traffic
(P bytes pulled + P pushed per iteration) crosses the one dense-PS link.

With one worker this is exactly single-process training (`recjax.train.step.train_step`):
tests/test_async_ps.py checks it.

    python scripts/train.py --algo async --trainers 2 --workers-per-trainer 2
"""

from __future__ import annotations

import collections
import dataclasses

from algorithms.runtime import RoleSpec, Runtime, Worker, intervals
from recjax.config import Config


def worker_role(rt: Runtime, worker: Worker, server):
    """Pull, compute, push (the PS applies it at once), until the worker's shard is done."""
    p = rt.dense_bytes
    it = 0
    while (item := worker.take()) is not None:
        params, version = server.pull()
        g_params, pending, work = worker.compute(params, item, it)
        yield dataclasses.replace(work, transfers=work.transfers + ((rt.dense_link, 2 * p),))
        worker.push(pending)
        server.push(g_params, version)
        it += 1


def run(cfg: Config) -> dict:
    """``--algo async``: train, evaluate, return (and write) the summary."""
    return intervals.run(cfg, cfg.runtime.hogwild_workers, interval)


def interval(rt: Runtime) -> dict:
    """One checkpoint interval of the run (`intervals.run`); its `Runtime.finish`."""
    s0 = rt.init_state
    # The dense PS lives where the roles do (`Placement.dense_ps`): in this process when they
    # run here (under Ray with driver roles an actor of its own moved more bytes: the driver
    # owns the references of the calls it makes, so the params and gradients went actor ->
    # driver -> actor, 0.755 -> 0.81 of threads, docs/performance.md), in an actor that the
    # workers' actors call directly when the roles run there (--ray.roles actors).
    server = rt.placement.dense_ps(s0.params, s0.opt_state)
    supply = rt.static_shards()
    workers = [rt.placement.worker(w, supply) for w in range(rt.num_workers)]
    roles = [RoleSpec(f"worker{w.wid}", rt.placement.run_role(worker_role, w, server))
             for w in workers]

    # the staleness of the run before this call (its checkpoint's), and this call's
    base = collections.Counter({int(k): v for k, v in rt.base_counts.get("staleness", {}).items()})
    rt.counts = lambda: {"staleness": {str(k): v for k, v in server.staleness.items()}}

    def counters() -> dict:  # the whole run's
        hist = dict(sorted((base + server.staleness).items()) if base
                    else sorted(server.staleness.items()))
        n = sum(hist.values())
        return {"staleness_histogram": {str(k): v for k, v in hist.items()},
                "mean_staleness": sum(k * v for k, v in hist.items()) / max(n, 1),
                "max_staleness": max(hist, default=0), "dense_ps_bytes": 2 * rt.dense_bytes * n}

    sched = rt.execute(roles, supply, workers=workers, counters=counters, snapshot=lambda: (
        *server.snapshot(), rt.start_step + server.version))
    return rt.finish(server.params, server.opt_state, sched, workers, counters())
