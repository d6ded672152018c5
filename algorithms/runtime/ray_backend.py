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
  function the threads run (`engine.make_grads`), rebuilt in the actor from the config.
* `host`: any value-only server (``ps.DensePS``, ``ps.SyncPS``, GBA's PS0) as an actor behind
  a `Hosted` proxy of the same interface; calls are remote, references nested in arguments
  are resolved in the actor.

Failures. A worker-group actor that dies ends the in-flight batch of each of its workers:
`ray_workers.RayWorker.compute` raises `clock.WorkerLost`, the interpreter ends that role and counts it,
the other roles go on. A PS actor that dies is restarted from its last in-memory snapshot
(every ``ray.snapshot_every`` pushes, kept in the object store by the driver) and the request
is retried; the pushes applied since the snapshot are lost and counted. After
``ray.max_ps_restarts`` restarts of one shard the run stops with `PsFailed`. ``ray.kill``
injects both faults with SIGKILL (tests/test_ray_backend.py).

Checkpoints. Pushes are synchronous (a role's push returns once every shard applied it), so
when the roles have stopped no push is in flight: the snapshot the engine writes after the
roles (end of run, Ctrl-C) is consistent across shards and has the single-device layout, so
a Ray run resumes on threads and back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import signal as signal_lib
from typing import Any

import jax
import numpy as np

from algorithms.runtime import ps as ps_lib
from recjax.config import RayConfig

ROOT = str(pathlib.Path(__file__).resolve().parents[2])  # the repository: recjax, algorithms
_CLUSTERS: list[Cluster] = []  # started by this process, stopped by `shutdown`
# Each actor process is one worker's (or one shard's) compute: one XLA thread each, instead of
# every process spinning a pool as wide as the host (oversubscription on small hosts). The
# pool's size is PJRT's CPU client's, ``PJRT_NPROC`` or else the host's cores (XLA_FLAGS do not
# set it); a group of m workers gets m (`Cluster.spawn`), since its workers' computations run
# on that pool. On the 2-core box, async PS with 2 worker processes: 0.66 -> 0.73 of threads
# (docs/performance.md, "Since (fourteenth session)").
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


class Cluster:
    """The run's Ray instance and the actors it started.

    Starts a local instance (``ray.address`` empty) or joins a cluster; `stop` kills every
    actor of the run and shuts a local instance down, leaving no process behind.
    """

    def __init__(self, rc: RayConfig):
        ray = _ray()
        self.rc, self.actors, self.started = rc, [], False
        self._remote: dict[type, Any] = {}
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
                with _loopback_node():
                    ray.init(address="local", num_cpus=rc.num_cpus or None,
                             include_dashboard=False, logging_level=logging.WARNING,
                             _node_ip_address=LOOPBACK, _system_config=system_config(rc),
                             runtime_env={"env_vars": {"PYTHONPATH": path, **ACTOR_ENV}})
            self.started = True
            _CLUSTERS.append(self)

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

    def stop(self) -> None:
        ray = _ray()
        for h in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(h, no_restart=True)
        self.actors = []
        if self.started:
            ray.shutdown()
            self.started = False
            if self in _CLUSTERS:
                _CLUSTERS.remove(self)


def shutdown() -> None:
    """Stop every cluster this process started (the safety net of `algorithms.run`)."""
    for c in list(_CLUSTERS):
        c.stop()


# -- references nested in arguments -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ShardGrads:
    """A worker's row gradients as one object reference per PS shard (``None``: no tables)."""

    refs: tuple


def resolve(x: Any) -> Any:
    """`x` with every object reference in it fetched (dataclasses, tuples, lists, dicts);
    `ShardGrads` becomes the merged ``table -> gradient`` dict."""
    ray = _ray()
    if isinstance(x, ray.ObjectRef):
        return ray.get(x)
    if isinstance(x, ShardGrads):
        out = {}
        for part in ray.get([r for r in x.refs if r is not None]):
            out.update(part)
        return out
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: resolve(getattr(x, f.name))
                                         for f in dataclasses.fields(x)})
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(resolve(v) for v in x)
    if isinstance(x, list):
        return [resolve(v) for v in x]
    if isinstance(x, dict):
        return {k: resolve(v) for k, v in x.items()}
    return x


def host_value(x: Any) -> Any:
    """What a call sends: object references as they are, jax arrays as numpy."""
    if isinstance(x, _ray().ObjectRef):
        return x
    return jax.device_get(x)


# -- rows as they travel between a worker actor and a shard actor ------------------------------
# A batch's mini table has a fixed row count M (jit shapes), but only its first n rows are real
# (n unique ids; on dlrm_kaggle batches of 4096 about 22% of M). Between actors only those n
# rows travel, each way; the receiver pads with zeros. The same update: the filler rows are never
# looked up, and a shard writes back only the first n rows (`ps.EmbeddingShard.push`); the sums
# pushed are the sparse optimizer's own, to rounding under SGD (`ps.row_push`).
def wire_rows(rows: dict) -> dict:
    """A shard's `ps.Rows` as they travel to and between actors: ``name -> (real ids, M,
    filler id)``, the n real ids without the M - n fillers (on dlrm_kaggle batches of 4096,
    850 KB of int64 ids per step become 190 KB; every byte a call carries costs both ends CPU,
    docs/performance.md). `unwire_rows` rebuilds the padded rows exactly."""
    return {k: (ids[:n], ids.size, ids[n] if n < ids.size else 0) for k, (ids, n) in rows.items()}


def unwire_rows(wire: dict) -> dict:
    """`wire_rows` undone: ``name -> (ids padded with their filler to M, n)``."""
    out = {}
    for k, (real, size, fill) in wire.items():
        ids = np.full(size, fill, real.dtype)
        ids[:real.size] = real
        out[k] = (ids, real.size)
    return out


def pack_rows(minis: dict, rows: dict) -> dict:
    """The real rows of each mini table, ``name -> f32[n, D]`` (``rows[name] = (ids, n)``)."""
    return {k: v[:rows[k][1]] for k, v in minis.items()}


def unpack_rows(part: dict, rows: dict) -> dict:
    """`pack_rows` undone: ``name -> f32[M, D]``, the rows past n zero."""
    return {k: ps_lib.pad_rows(v, rows[k]) for k, v in part.items()}


def unpack_sums(part: dict, rows: dict) -> dict:
    """A push of `pack_rows` of per-row sums (``grads_rows``), padded back, as a shard's push
    takes them (`ps.row_push`: the same update as the entries they sum, to rounding under SGD,
    which scales each entry before adding)."""
    return {k: ps_lib.row_push(v) for k, v in unpack_rows(part, rows).items()}


# -- hosted servers -----------------------------------------------------------------------------
class _Host:
    """The actor body of `host`: an object built by `factory`, called by method name."""

    def __init__(self, factory, *args):
        self.obj = factory(*args)

    def call(self, method: str, *args) -> Any:
        """The method's result, its jax arrays as numpy: Ray pickles a jax array through
        ``ArrayImpl.__reduce__``, on the 2-core box 6.5-7.5 ms of CPU to return dlrm_kaggle's
        2 MB of dense params (GBA's PS0's) against 3.8-4.0 ms as numpy
        (docs/performance.md)."""
        return jax.device_get(getattr(self.obj, method)(*resolve(args)))

    def attr(self, name: str) -> Any:
        return getattr(self.obj, name)

    def pid(self) -> int:
        return os.getpid()


class Hosted:
    """A proxy of an object living in an actor (see `host`).

    Methods of `cls` become blocking remote calls; other attributes are remote reads, except
    the ones in `local`. After a call of a method in `mutating`, `local["signal"]` (if any) is
    notified, as the threaded server notifies its own signal after a write. A method in
    `by_ref` (``name -> results``) is not waited for: it returns its result tuple as object
    references (e.g. the dense params and version a worker pulls go from the PS actor to the
    worker's actor and back to the PS without passing through the driver).
    """

    def __init__(self, handle, cls: type, local: dict | None = None, mutating=(),
                 by_ref: dict | None = None):
        self.__dict__.update(_handle=handle, _cls=cls, _local=local or {},
                             _mutating=set(mutating), _by_ref=by_ref or {})

    def __getattr__(self, name: str) -> Any:
        ray = _ray()
        if name in self._local:
            return self._local[name]
        if not callable(getattr(self._cls, name, None)):
            return ray.get(self._handle.attr.remote(name))

        def method(*args):
            args = tuple(host_value(a) if not isinstance(a, ShardGrads) and not
                         dataclasses.is_dataclass(a) else a for a in args)
            if name in self._by_ref:
                out = tuple(self._handle.call.options(num_returns=self._by_ref[name]).remote(
                    name, *args))
            else:
                out = ray.get(self._handle.call.remote(name, *args))
            if name in self._mutating and "signal" in self._local:
                self._local["signal"].notify()
            return out

        return method

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._cls.__name__} lives in a Ray actor; set {name} through "
                             "one of its methods")
