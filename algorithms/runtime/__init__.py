"""The host-async engine the asynchronous algorithms share (DESIGN.md section 4.2).

* ``clock.py``: the effects roles yield (`Work`, `Collective`, `Wait`) and their two
  interpreters (`run_threaded`, `run_virtual`);
* ``ps.py``: parameter servers that speak in values (embedding PS shards, sync PS, dense PS);
* ``supply.py``: the run's data (`Feed`) and batch supplies (static per-worker shards, GBA's
  shared data list);
* ``stragglers.py``: seeded slowdown models;
* ``engine.py``: `Runtime`, what the roles of one run share: its parts, compile and warm-up,
  and the roles' run (`Runtime.execute`);
* ``placement.py``: where PS shards, workers' compute and shared servers live (this process,
  or Ray actors: ``ray_placement.py``), chosen once per run;
* ``worker.py``: what one worker computes and counts (gradients on mini tables, `Worker`);
* ``intervals.py``: a run from checkpoint to checkpoint (``train.ckpt_every``) on one `Runtime`;
  ``segments.py``: where each interval starts and stops, the roles' stop signals;
* ``finish.py``: the checkpoint a stop leaves, and the run's end (eval, checkpoint, summary);
* ``report.py``: progress bar, train / eval / counters records and TensorBoard while it runs;
* ``ray_backend.py``: ``--backend ray``'s cluster and the watch over its processes; what
  travels between its actors and the hosted servers in ``ray_wire.py``, its PS shards in
  ``ray_ps.py``, its worker groups in ``ray_workers.py``.

The algorithms (``async_ps.py``, ``shadowsync.py``, ``gba.py``) are modules beside this package.
"""

from algorithms.runtime import intervals, stragglers
from algorithms.runtime.clock import (
    Collective,
    Link,
    Rendezvous,
    RoleSpec,
    Schedule,
    Signal,
    Wait,
    Work,
    WorkerLost,
    run_threaded,
    run_virtual,
)
from algorithms.runtime.engine import Runtime
from algorithms.runtime.report import histogram_summary
from algorithms.runtime.worker import Counters, Replica, Worker

__all__ = ["Collective", "Counters", "Link", "Rendezvous", "Replica", "RoleSpec", "Runtime",
           "Schedule", "Signal", "Wait", "Work", "Worker", "WorkerLost", "histogram_summary",
           "intervals", "run_threaded", "run_virtual", "stragglers"]
