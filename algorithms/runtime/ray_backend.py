"""The Ray backend of the host-async engine (``--backend ray``; docs/distributed.md).

Under ``ray`` the state and the compute of a run live in Ray actor processes; the roles
(``clock.py``'s generators, unchanged) still run in the driver's threads, where they only
orchestrate: they hand object references from actor to actor, so the arrays a role moves go
through Ray's object store between the processes that own them, not through the driver.

* `ray_ps.ShardServer`: one actor per embedding PS shard (a `ps.EmbeddingShard` or `ps.LruShard`
  built in the actor), serving ``ray.ps_concurrency`` requests at once, so pulls and pushes of
  different workers overlap (Hogwild across workers, as the threaded shards). `RayEmbeddingPS`
  is `ps.EmbeddingPS`'s interface over them: one call per (batch, shard) in each direction,
  never per id, carrying only that shard's tables.
* `ray_workers.ComputeServer`: one actor per worker group (a worker of async PS and GBA, a trainer's m
  workers for ShadowSync, an NN worker of Persia), running single-process JAX: the gradient
  function the threads run (`worker.make_grads`), rebuilt in the actor from the config.
* `ray_wire.Hosted`: a value-only server the roles share (GBA's PS0) as an actor behind a
  proxy of the same interface; calls are remote, references nested in arguments are resolved
  in the actor. ``ray_wire.py`` also holds what travels between the actors (the real ids and
  rows of a batch).
* `ray_placement.RayPlacement`: the engine's `placement.Placement` under Ray, which puts each
  of these where it lives; the engine and the algorithms never ask which placement runs.

This module is the cluster: the run's Ray instance, its actors, and the watch over the
processes whose death stops the run.

Failures. A worker-group actor that dies ends the in-flight batch of each of its workers:
`ray_workers.RayWorker.compute` raises `clock.WorkerLost`, the interpreter ends that role and counts it,
the other roles go on. A PS actor that dies is restarted from its last in-memory snapshot
(every ``ray.snapshot_every`` pushes, kept in the object store by the driver) and the request
is retried; the pushes applied since the snapshot are lost and counted. After
``ray.max_ps_restarts`` restarts of one shard the run stops with `PsFailed`. ``ray.kill``
injects both faults with SIGKILL (tests/test_ray_backend.py). Ray's own processes (GCS, the
raylet) and the actors of hosted servers are watched by `Cluster.check`: their death stops the
run with a message naming them (`ControlLost`: checkpointed; `StateLost`: the latest committed
checkpoint stands), and `reaper.py` cleans up after a killed driver (docs/distributed.md).

Checkpoints. Pushes are synchronous (a role's push returns once every shard applied it), so
when the roles have stopped no push is in flight: the snapshot the engine writes after the
roles (end of run, Ctrl-C) is consistent across shards and has the single-device layout, so
a Ray run resumes on threads and back.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pathlib
import signal as signal_lib
import sys
import threading
import time
import uuid
from typing import Any

from algorithms.runtime import reaper
from algorithms.runtime.reaper import MARK
from algorithms.runtime.segments import StateLost, with_latest
from recjax.config import RayConfig

ROOT = str(pathlib.Path(__file__).resolve().parents[2])  # the repository: recjax, algorithms
_CLUSTERS: list[Cluster] = []  # started by this process, stopped by `shutdown`
# Each actor process is one worker's (or one shard's) compute: one XLA thread each, instead of
# every process spinning a pool as wide as the host (oversubscription on small hosts). The
# pool's size is PJRT's CPU client's, ``PJRT_NPROC`` or else the host's cores (XLA_FLAGS do not
# set it); a group of m workers gets m (`Cluster.spawn`), since its workers' computations run
# on that pool. On the 2-core box, async PS with 2 worker processes: 0.66 -> 0.73 of threads
# (docs/performance.md, "One XLA thread per actor").
ACTOR_ENV = {"PJRT_NPROC": "1", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}


def system_config(rc: RayConfig) -> dict:
    """A local instance's Ray settings: objects up to ``ray.inline_kb`` travel inside the
    call's message instead of through the shared-memory store (on the 2-core box a 131 KB
    result costs 4.2 ms through the store, 2.2 ms inline: docs/performance.md, "Ray
    backend"); a call's inlined arguments together may reach 4x that."""
    limit = rc.inline_kb << 10
    # Off: the per-call task events and metrics that feed Ray's dashboard and state API (a
    # local instance runs without the dashboard); 5 of 5 interleaved repeats ahead, +0.005 of
    # threads (docs/performance.md).
    quiet = {"task_events_report_interval_ms": 0, "event_stats": False,
             "enable_metrics_collection": False}
    return {"max_direct_call_object_size": limit, "task_rpc_inlined_bytes_limit": 4 * limit,
            **quiet}


def _ray():
    import ray  # only the Ray backend needs it

    return ray


LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def _loopback_node():
    """Keep a local instance's node address at 127.0.0.1 while it starts.

    Ray 2.60's ``ray.init`` turns a node address of 127.0.0.1 into the host's routable one
    (``ray._private.services.resolve_ip_for_localhost``), and GCS, the raylet, every worker's
    gRPC server and the autoscaler's metrics endpoint then listen on every interface (``::``,
    ``0.0.0.0``). With the address kept, each of them binds 127.0.0.1 only: a local instance
    talks to no other host (tests/test_ray_processes.py lists its listening sockets). Should a
    later Ray drop the function, the address is passed as it is and that test says whether the
    servers still face the network.
    """
    from ray._private import services

    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if resolve is None:
        yield
        return
    services.resolve_ip_for_localhost = lambda host: host
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = resolve


def parse_kill(spec: str) -> dict[tuple[str, int], int]:
    """``worker:W@I,ps:S@I`` -> ``{(kind, index): iteration}``.

    Raises:
      ValueError: naming the bad term and the expected form.
    """
    out = {}
    for term in filter(None, (t.strip() for t in spec.split(","))):
        try:
            kind, rest = term.split(":")
            idx, at = rest.split("@")
            key, when = (kind, int(idx)), int(at)
        except ValueError:
            raise ValueError(f"ray.kill: {term!r} is not KIND:INDEX@ITERATION (e.g. worker:0@5 "
                             "or ps:1@20)") from None
        if kind not in ("worker", "ps") or key[1] < 0 or when < 1:
            raise ValueError(f"ray.kill: {term!r}: KIND is worker or ps, INDEX >= 0, "
                             "ITERATION >= 1")
        out[key] = when
    return out


def sigkill(handle, pid: int) -> None:
    """kill -9 an actor's process (on this host), or have Ray kill it (another host)."""
    try:
        os.kill(pid, signal_lib.SIGKILL)
    except ProcessLookupError:
        _ray().kill(handle, no_restart=True)


class ControlLost(OSError):
    """Ray's GCS server died while the actors, and so the run's state, are still reachable:
    the engine stops the roles and checkpoints that state (Ray itself would end the driver
    60 s after losing its GCS)."""


CHECK_S = 0.5  # how often `Cluster.check` looks at the vital processes
QUIET = "RAY_IGNORE_UNHANDLED_ERRORS"


def _alive(pid: int, started: float) -> bool:
    """Whether process `pid` (created at `started`) still runs (a zombie does not)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Cluster:
    """The run's Ray instance and the actors it started.

    Starts a local instance (``ray.address`` empty) or joins a cluster; `stop` kills every
    actor of the run and shuts a local instance down, leaving no process behind.

    Vital processes (docs/distributed.md, "Failures"): `check` raises when one has died, so the
    run stops with a message instead of a traceback or Ray's own 60 s timeout:
    * the local instance's GCS server: `ControlLost`, the state is checkpointed from the actors;
    * its raylet (every actor dies with it) or a hosted server's actor (`watch`; GBA's PS0, the
      dense PS of async and ShadowSync, which are not restarted): `StateLost`, no checkpoint can
      be written, the last committed one stands.
    Every process of a local instance carries ``MARK`` in its environment, so `stop` finds and
    kills the ones Ray's shutdown leaves (agents whose raylet or GCS died linger for minutes).
    """

    def __init__(self, rc: RayConfig, out: str = ""):
        ray = _ray()
        self.rc, self.actors, self.started, self.out = rc, [], False, out
        self._remote: dict[type, Any] = {}
        self._vital: dict[int, tuple[str, float, type]] = {}  # pid -> (what, created, error)
        self._checked, self.token, self._env_quiet = 0.0, "", None
        self._core: dict = {}  # GCS and the raylet, as in `_vital`
        self._agents: list[tuple[int, float]] = []  # the raylet's agents (no MARK: own env)
        self._reaper = None
        self._lock, self._stopping = threading.Lock(), False  # `stop` vs `_watch_gcs`
        if not ray.is_initialized():
            if rc.address:  # another host may not have this checkout: ship the packages
                env = {"py_modules": [os.path.join(ROOT, m) for m in
                                      ("recjax", "algorithms", "sharding")],
                       "env_vars": ACTOR_ENV}
                ray.init(address=rc.address, runtime_env=env, logging_level=logging.WARNING)
            else:
                path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
                # "local": a new instance even when `ray start` left one on this host;
                # reachable from this host only (`_loopback_node`)
                self.token = uuid.uuid4().hex
                os.environ[MARK] = self.token  # inherited by GCS, the raylet and its children
                try:
                    with _loopback_node():
                        ray.init(address="local", num_cpus=rc.num_cpus or None,
                                 include_dashboard=False, logging_level=logging.WARNING,
                                 _node_ip_address=LOOPBACK, _system_config=system_config(rc),
                                 runtime_env={"env_vars": {"PYTHONPATH": path, **ACTOR_ENV}})
                except Exception as e:  # e.g. GCS or the raylet died while it started
                    self._kill_marked()
                    with contextlib.suppress(Exception):
                        ray.shutdown()
                    raise OSError(f"the local Ray instance did not start: {e}") from e
                finally:
                    del os.environ[MARK]
                node = ray._private.worker._global_node
                for key, what, err in (("gcs_server", "Ray's GCS server", ControlLost),
                                       ("raylet", "Ray's raylet", StateLost)):
                    for info in node.all_processes.get(key, []):
                        self._watch_pid(info.process.pid, what, err)
                self._core = dict(self._vital)
                self._agents = self._children(next(iter(node.all_processes.get("raylet", [])),
                                                   None))
                self._reaper = self._start_reaper()
                self.started = True
                atexit.register(self._stop_watching)  # before Ray's own exit hook stops GCS
                threading.Thread(target=self._watch_gcs, name="recjax-ray-watch",
                                 daemon=True).start()
            self.started = True
            _CLUSTERS.append(self)

    def _watch_gcs(self) -> None:
        """While no role runs (setup, the end of an interval) nothing polls `check`, and the
        driver may wait on Ray, which ends this process 60 s after losing GCS (a C++ exit, no
        message). If GCS dies then (not by `stop`), say so, leave no process, and exit with 2
        at once: nothing of the interval can be saved without its roles, and the latest
        committed checkpoint is whole (a save cut short never commits)."""
        gcs = [(p, t) for p, (_, t, err) in self._core.items() if err is ControlLost]
        while self.started and not self._stopping:
            time.sleep(CHECK_S)
            if time.monotonic() - self._checked < 4 * CHECK_S:
                continue  # the roles' poll is alive: `check` stops the run with a checkpoint
            dead = [p for p, t in gcs if not _alive(p, t)]
            if not dead:
                continue
            with self._lock:
                if self._stopping:  # `stop` shut it down
                    return
                lost = with_latest(StateLost(f"Ray's GCS server (pid {dead[0]}) died while no "
                                             "role was running (setup, or between intervals)"),
                                   self.out)
                print(f"error: {lost}", file=sys.stderr, flush=True)
                self._kill_marked()
                os._exit(2)

    def _start_reaper(self):
        """`reaper.py`'s process, told the instance's processes: it kills what is left of the
        instance if this process dies unasked (kill -9: the agents would wait ~40 s)."""
        import subprocess

        r = subprocess.Popen([sys.executable, reaper.__file__, self.token],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        pids = [*self._core, *(p for p, _ in self._agents)]
        r.stdin.write("".join(f"{p} {reaper.start_time(p)}\n" for p in pids))
        r.stdin.flush()
        return r

    @staticmethod
    def _children(info) -> list[tuple[int, float]]:
        """(pid, created) of the raylet's child processes: its agents, started with an
        environment of their own (so without ``MARK``)."""
        import psutil

        if info is None:
            return []
        try:
            return [(c.pid, c.create_time()) for c in psutil.Process(info.process.pid).children()]
        except psutil.Error:
            return []

    def _quiet_orphans(self) -> None:
        """The results of calls on a dead process that no role reads any more: Ray would print
        each as an "Unhandled error" traceback when it is freed; the run's error says why."""
        if self._env_quiet is None:
            self._env_quiet = os.environ.get(QUIET, "")
            os.environ[QUIET] = "1"

    def _watch_pid(self, pid: int, what: str, err: type) -> None:
        import psutil

        with contextlib.suppress(psutil.Error):  # already gone: `check` says so
            self._vital[pid] = (what, psutil.Process(pid).create_time(), err)

    def watch(self, handle, what: str) -> None:
        """Stop the run (`StateLost`) when `handle`'s actor dies: it holds state that is not
        restarted (a local instance only: on a cluster the actor's host may be another)."""
        if self.started:
            self._watch_pid(_ray().get(handle.pid.remote()), what, StateLost)

    def check(self, now: bool = False) -> None:
        """Raise `ControlLost` or `StateLost` if a vital process has died (looks every
        ``CHECK_S`` seconds, or at once with `now`)."""
        t = time.monotonic()
        if not now and t - self._checked < CHECK_S:
            return
        self._checked = t
        dead = [(pid, what, err) for pid, (what, started, err) in self._vital.items()
                if not _alive(pid, started)]
        if not dead:
            return
        pid, what, err = min(dead, key=lambda d: d[2] is ControlLost)  # state lost comes first
        self._quiet_orphans()
        if err is ControlLost:
            raise ControlLost(f"{what} (pid {pid}) died; the actors still held the run's "
                              "state, so the run stopped and checkpointed it: continue with "
                              "--resume")
        raise StateLost(f"{what} (pid {pid}) died, and the run's state held there with it "
                        "(Ray does not restart it); the run stops without a new checkpoint")

    def spawn(self, cls: type, *args, concurrency: int = 1, resource: str = "",
              xla_threads: int = 1) -> Any:
        """An actor of `cls` (a plain class) built from `args` in its own process, whose XLA
        runs on `xla_threads` threads (computations of different threads run in parallel only
        up to that many)."""
        ray = _ray()
        if cls not in self._remote:
            self._remote[cls] = ray.remote(cls)
        opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": concurrency, "max_restarts": 0}
        if resource:
            opts["resources"] = {resource: 1}
        if xla_threads != 1:  # merged with the instance's env_vars (ACTOR_ENV)
            opts["runtime_env"] = {"env_vars": {"PJRT_NPROC": str(xla_threads)}}
        handle = self._remote[cls].options(**opts).remote(*args)
        self.actors.append(handle)
        return handle

    def _stop_watching(self) -> None:
        with self._lock:  # from here GCS goes away on purpose
            self._stopping = True

    def stop(self) -> None:
        ray = _ray()
        self._stop_watching()
        atexit.unregister(self._stop_watching)
        broken = self.started and any(not _alive(pid, started) for pid, (_, started, _e)
                                       in self._core.items())
        if broken:  # GCS or the raylet is gone: asking Ray to kill would wait on them
            self._kill_marked()
        else:
            for h in self.actors:
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(h, no_restart=True)
        self.actors = []
        if self.started:
            ray.shutdown()
            self.started = False
            if self in _CLUSTERS:
                _CLUSTERS.remove(self)
            deadline = time.monotonic() + 5  # Ray's processes exit on their own after shutdown
            while (reaper.marked(self.token) or any(_alive(p, t) for p, t in self._agents)) and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            self._kill_marked()  # what is left (e.g. agents waiting for a dead GCS)
            if self._reaper is not None:  # nothing left for it to do: let it go
                self._reaper.stdin.close()
                self._reaper.wait()
                self._reaper = None
        if self._env_quiet is not None:
            if self._env_quiet:
                os.environ[QUIET] = self._env_quiet
            else:
                os.environ.pop(QUIET, None)
            self._env_quiet = None

    def _kill_marked(self) -> None:
        """SIGKILL every process of the local instance still running: the ones with ``MARK``
        and the raylet's agents (which, their raylet or GCS gone, wait minutes to exit)."""
        import psutil

        pids = reaper.marked(self.token)
        for pid in list(pids):  # the raylet's agents have an environment of their own
            with contextlib.suppress(psutil.Error):
                pids += [c.pid for c in psutil.Process(pid).children()]
        reaper.kill(pids + [p for p, t in self._agents if _alive(p, t)])


def diagnose(e: BaseException) -> BaseException:
    """`e`, or a `StateLost` saying which vital process of a running instance died (while the
    run set up or finished: outside the roles, where `Cluster.check` is not polled, the first
    sign is an error of Ray's own, e.g. an actor "died because its owner has died")."""
    if isinstance(e, (StateLost, ControlLost, KeyboardInterrupt)):
        return e
    for c in _CLUSTERS:
        try:
            c.check(now=True)
        except OSError as lost:
            return StateLost(str(lost).split(";")[0] + "; the run stops without a new checkpoint")
    return e


def shutdown() -> None:
    """Stop every cluster this process started (the safety net of `algorithms.run`)."""
    for c in list(_CLUSTERS):
        c.stop()
