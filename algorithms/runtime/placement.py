"""Where a host-async run's PS shards, workers' compute and shared servers live (DESIGN.md 4.2).

The engine (``engine.py``) and the algorithms ask a `Placement` for each of these and never ask
which placement runs: it is chosen once per run, from the config (`choose`):

* `InProcess` (``--backend threads``, and ``--deterministic``'s virtual clock): everything in
  this process; a shared server is the object itself;
* ``ray_placement.RayPlacement`` (``--backend ray``): PS shards, worker groups and hosted
  servers as Ray actor processes, and the watch over the processes whose death stops the run.

The roles (``clock.py``'s generators) are the same under both. They run in this process, or
(``--ray.roles actors``, `run_role`) a worker's role runs in its worker actor
(``ray_roles.py``), with the servers it shares (`dense_ps`, `host`) as actors too.
`settle`, `lost` and `shutdown` are `algorithms.run`'s part of it: the backend a config may
name, the Ray process whose death caused a run's error, no Ray process outliving a run.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Protocol

import jax

from algorithms.runtime import ps as ps_lib
from algorithms.runtime.clock import Rendezvous
from algorithms.runtime.worker import LocalFn, Worker, companion_here
from recjax.config import Config

Runtime = Any  # `engine.Runtime` (not imported: the engine imports this module)
_RAY = "algorithms.runtime.ray_backend"  # imported by the Ray placement only


class Placement(Protocol):
    """The interface the engine and the algorithms call (`InProcess`, `RayPlacement`).

    Attributes:
      name: the summary's ``backend``: ``virtual``, ``threads`` or ``ray``.
      tables_here: whether this process draws the initial tables (under Ray each PS shard's
        actor draws its own, so no process holds every table).
      data_here: whether this process reads the workers' training data (with the roles in
        the actors each worker actor reads its own shard: this process keeps no cache of it).
      stop_saving: the exceptions that stop the roles and leave a checkpoint of their state.
      final_tables: a run's returned ``final_state`` holds every table (where they are not
        here: gathered at the end; ``ray.final_tables``).
      step_poll_s: the least seconds between two reads of the run's step by the report's
        poll (``report.py``; the step may be a call to another process, e.g. GBA's PS0).
      poll_s: how often the main thread looks at the running roles (a failed one, the
        watchdog, the report's records and bar).
    """

    name: str
    tables_here: bool
    data_here: bool
    final_tables: bool
    step_poll_s: float
    poll_s: float
    stop_saving: tuple[type[BaseException], ...]

    def make_ps(self, layout, sparse_opt, tables: dict, slots: dict,
                table_shard: dict[str, int], shards: int,
                lru: dict | None) -> ps_lib.EmbeddingPS:
        """The embedding PS (`ps.EmbeddingPS`'s arguments and interface)."""

    def host(self, cls: type, factory, *args, dense_grads: bool = False,
             near_roles: bool = False, **proxy) -> Any:
        """The server ``factory(*args)`` the roles share (an instance of `cls`): the object
        itself, or a proxy of `cls`'s methods to it in a process of its own. `proxy` keywords
        (`ray_wire.Hosted`) say which attributes stay here, which methods notify, which
        results stay references; `dense_grads`: the workers' dense gradients go to it;
        `near_roles`: in a process of its own only where the roles run in theirs."""

    def host_blocks(self, cls: type, factory, params: Any, *args,
                    near_roles: bool = False) -> Any:
        """`host` for a server of the dense params whose methods take and return
        params-shaped trees (S-EASGD's sync PS: exchange, snapshot, restore), which under
        ``--ray.dense_shards D`` is cut into D servers, each of a block of whole leaves
        (``ray_dense.SyncShards``)."""

    def host_group_blocks(self, cls: type, factory, dense: tuple, *args,
                          joins: dict | None = None) -> Any:
        """`host` (``near_roles``) for a server of the dense state `dense` (a tuple of
        params-shaped trees: params, optimizer state, a gradient) with `collectives.
        Collectives`' calls (Persia's NN workers' `DenseGroup`), built ``factory(*dense,
        *args)``. Under ``--ray.dense_shards D``: D servers, each of a block of whole leaves of
        every tree in `dense`; their `parties` join every block at once
        (``ray_wire.BlockGroup``), and a read ``m()`` is every block's, joined like
        ``joins[m]`` (block 0's where `joins` has no `m`: counts every block keeps alike)."""

    def beside(self, group: int, factory, *args, group_size: int = 1,
               name: str | None = None) -> Any:
        """An object ``factory(*args)`` the roles of worker group `group` share (a ShadowSync
        trainer's replica, a party's `shadowsync.Syncer`): the object itself, or where that
        group's roles run in its process, made there, behind a proxy that reads and sets it
        from here; `name` tells apart several of one factory in one group (default: the
        factory's name)."""

    def rendezvous(self, count: int, n: int, reduce, like: Any = None) -> list:
        """`count` all-reduce groups of `n` parties (what a ``clock.Collective`` joins):
        ``clock.Rendezvous`` objects here, or where the parties' roles run in their actors,
        hosted in an actor of their own (``ray_wire.RemoteGroup``); `like`: a party's value,
        the `reduce` compiled on it where it runs."""

    def companion(self, group: int, counters, group_size: int = 1, worker=None) -> Any:
        """What `run_role` takes for a role without batches beside group `group`'s workers
        (ShadowSync's shadow; Persia's embedding backward role, which reaches the PS through
        the group's `worker`): an object whose ``counters`` are `counters` (`worker` itself,
        if given, where the role runs here)."""

    def dense_ps(self, params: Any, opt_state: Any) -> Any:
        """The async dense PS (`ps.DensePS`'s interface): in this process, or hosted in an
        actor when the workers' roles run in theirs (they call it directly)."""

    def run_role(self, fn, worker, *args, lost=None) -> Any:
        """The role ``fn(rt, worker, *args)`` (a module-level generator function) as this
        process runs it: the generator itself, or the driver's side of it run in `worker`'s
        actor (``ray_role_driver.remote_role``), which calls ``lost(wid)`` if that actor's process
        dies (where the role runs here, it sees the death itself: `clock.WorkerLost`)."""

    def worker(self, wid: int, supply, group: int | None = None, group_size: int = 1,
               compute: bool = True) -> Worker:
        """Worker `wid` (`worker.Worker`'s interface) taking batches from `supply` (None: a
        role that takes none, Persia's NN workers); `group`: the workers that share a process
        (ShadowSync's trainers, `group_size` of them); ``compute=False``: a role that takes
        batches and reaches the embedding PS (``pull``, ``push_rows``) but computes no
        gradient of its own (Persia's embedding workers): no compute process of its own
        where its role runs here."""

    def remote_fn(self, group: int, name: str, factory, *args) -> LocalFn:
        """``jax.jit(factory(ctx, *args))`` run in worker group `group`'s compute, called as
        `worker.LocalFn` is (``fn(*args)``, ``fn.timed(*args)``); handed to a role run in
        that group's process, the function there."""

    def role_fn(self, group: int, name: str, factory, *args) -> LocalFn:
        """`remote_fn` for a function a role of group `group` calls where the role runs:
        jitted here where the roles run here, in the group's process where they run there
        (Persia's embedding workers' lookup and row gradients)."""

    def parties(self, server: Any, count: int, n: int) -> list:
        """The `count` all-reduce groups of `n` parties of a server made by `host` with
        `collectives.Collectives`' calls (``groups``, ``join(k, index, value)``,
        ``close(k)``; Persia's `DenseGroup`), as a party's role joins them: the server's own
        ``groups``, or where it is hosted in an actor, groups joined through it
        (``ray_wire.RemoteGroup``)."""

    def warm(self, params: Any, batch: tuple, shares: bool = True) -> None:
        """Compile the workers' compute on `batch` (localized, rows) before the clock runs;
        `shares`: the supply gives each worker its own examples (the roles' processes then
        keep theirs only)."""

    def check(self, now: bool = False) -> None:
        """Raise (`segments.StateLost`, or an ``OSError`` whose state is still whole) if a
        process the run needs died; looks every half second, or at once with `now`."""

    def diagnose(self, e: BaseException) -> BaseException:
        """The failure to act on: `e`, or the death of a process the run needs that caused it."""

    def fault_counters(self) -> dict:
        """The summary's counters of the faults survived (restarts, lost pushes)."""

    def parts(self) -> list:
        """A checkpoint's parts (`recjax.checkpoint_parts.Part`): the tables that processes
        of their own write into the step; the state saved lacks them. [] = none (they are
        in the state)."""

    def loader(self, ps: ps_lib.EmbeddingPS) -> Any:
        """Where `tables_here` is false, the `ps` (made with ``tables=None``, or LRU stores) as
        a checkpoint's `recjax.checkpoint_parts.Loader`: each shard reads its own tables of
        the step resumed; None where this process holds the tables."""

    def table_shapes(self, ps: ps_lib.EmbeddingPS) -> tuple[dict, dict]:
        """``(tables, slots)`` of an LRU `ps` as a `TrainState` holds them: its snapshot here,
        or (where the stores live in other processes) their shapes and dtypes only."""

    def end_interval(self) -> None:
        """Between two checkpoint intervals of one run: the shared servers of the interval
        before (`host`) are done (PS shards and worker compute stay)."""

    def close(self) -> None:
        """Stop every process this placement started (none in-process); safe to repeat."""


class InProcess:
    """Everything in this process: the PS shards (`ps.EmbeddingPS`), each worker's compute
    (`worker.Worker`; jitted functions as `worker.LocalFn`), and a shared server, which is the
    object itself. Nothing can die here without the process: no check, no fault counters."""

    tables_here = data_here = final_tables = True
    stop_saving = (KeyboardInterrupt,)
    step_poll_s = 0.0  # every poll: the step is read here
    poll_s = 0.05  # the roles' steps are seen as they come

    def __init__(self, rt: Runtime, name: str):
        self.rt, self.name = rt, name
        self._fns: dict = {}

    def make_ps(self, layout, sparse_opt, tables, slots, table_shard, shards, lru):
        return ps_lib.EmbeddingPS(layout, tables, slots, sparse_opt, table_shard, shards, lru=lru)

    def host(self, cls, factory, *args, dense_grads=False, near_roles=False, **proxy):
        return factory(*args)

    def host_blocks(self, cls, factory, params, *args, near_roles=False):
        return factory(params, *args)

    def host_group_blocks(self, cls, factory, dense, *args, joins=None):
        return factory(*dense, *args)

    def dense_ps(self, params, opt_state):
        return ps_lib.DensePS(params, opt_state, self.rt.dense_apply)

    def run_role(self, fn, worker, *args, lost=None):
        return fn(self.rt, worker, *args)

    def worker(self, wid, supply, group=None, group_size=1, compute=True):
        return Worker(self.rt, wid, supply)

    def remote_fn(self, group, name, factory, *args):
        key = (name, args)  # the workers of one process share one compiled function
        if key not in self._fns:
            self._fns[key] = LocalFn(jax.jit(factory(self.rt, *args)))
        return self._fns[key]

    role_fn = remote_fn

    def parties(self, server, count, n):
        return server.groups

    def beside(self, group, factory, *args, group_size=1, name=None):
        return factory(*args)

    def rendezvous(self, count, n, reduce, like=None):
        return rendezvous_here(count, n, reduce, like)

    def companion(self, group, counters, group_size=1, worker=None):
        return companion_here(counters, worker)

    def warm(self, params, batch, shares=True):
        pass  # the engine compiled this process's functions while it set up

    def check(self, now=False):
        pass

    def diagnose(self, e):
        return e

    def fault_counters(self):
        return {}

    def parts(self):
        return []

    def loader(self, ps):
        return None

    def table_shapes(self, ps):
        return ps.snapshot()

    def end_interval(self):
        pass  # a shared server is the algorithm's object: it goes with the interval's roles

    def close(self):
        pass


def rendezvous_here(count: int, n: int, reduce, like=None) -> list:
    """`Placement.rendezvous` in this process: the reduce compiled on `like` before the clock
    runs."""
    if like is not None:
        jax.block_until_ready(reduce([like] * n))
    return [Rendezvous(n, reduce) for _ in range(count)]


def settle(cfg: Config) -> Config:
    """`cfg` with its placement settled before the run (`algorithms.run`): ``--backend
    virtual`` is ``--deterministic`` (the virtual clock, in this process).

    Raises:
      ValueError: ``--backend ray`` with ``--deterministic``.
    """
    backend = cfg.runtime.backend
    if backend == "ray" and cfg.train.deterministic:
        raise ValueError("--deterministic runs the roles on the virtual clock in one process; it "
                         "cannot be combined with --backend ray (drop one of them)")
    if backend == "virtual":  # the same as --deterministic
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=True))
    return cfg


def choose(cfg: Config, rt: Runtime) -> Placement:
    """The run's placement, made once: under ``--backend ray`` this starts (or joins) Ray."""
    if cfg.train.deterministic:
        return InProcess(rt, "virtual")
    if cfg.runtime.backend == "ray":
        from algorithms.runtime.ray_placement import RayPlacement

        return RayPlacement(rt)
    return InProcess(rt, cfg.runtime.backend)


def lost(e: BaseException) -> BaseException:
    """`e`, or the death of a process of a Ray instance this process started that caused it
    (outside the roles, where no placement's `check` is polled, the first sign of it is an
    error of Ray's own)."""
    ray = sys.modules.get(_RAY)
    return ray.diagnose(e) if ray is not None else e


def shutdown() -> None:
    """Stop every Ray instance this process started (the safety net of `algorithms.run`)."""
    ray = sys.modules.get(_RAY)
    if ray is not None:
        ray.shutdown()
