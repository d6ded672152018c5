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
* `ComputeServer`: one actor per worker group (a worker of async PS and GBA, a trainer's m
  workers for ShadowSync, an NN worker of Persia), running single-process JAX: the gradient
  function the threads run (`engine.make_grads`), rebuilt in the actor from the config.
* `host`: any value-only server (``ps.DensePS``, ``ps.SyncPS``, GBA's PS0) as an actor behind
  a `Hosted` proxy of the same interface; calls are remote, references nested in arguments
  are resolved in the actor.

Failures. A worker-group actor that dies ends the in-flight batch of each of its workers:
`RayWorker.compute` raises `clock.WorkerLost`, the interpreter ends that role and counts it,
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
import types
from typing import Any

import jax
import numpy as np

from algorithms.runtime import ps as ps_lib
from algorithms.runtime.clock import WorkerLost
from recjax.config import Config, RayConfig
from recjax.features import FeatureSpec
from recjax.train.step import Model

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
                # "local": a new instance even when `ray start` left one on this host
                ray.init(address="local", num_cpus=rc.num_cpus or None, include_dashboard=False,
                         logging_level=logging.WARNING, _system_config=system_config(rc),
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


# -- worker groups -----------------------------------------------------------------------------
class ComputeServer:
    """The actor body of a worker group: the run's model and gradient functions, built here
    from the config as `engine.Runtime` builds them (single-process JAX in this process).

    Args:
      cfg: the run's config.
      spec: the data's feature spec.
      batch_size: rows of one worker batch.
      shard_names: the tables of each PS shard (a result per shard).
    """

    def __init__(self, cfg: Config, spec: FeatureSpec, batch_size: int,
                 shard_names: list[list[str]]):
        from algorithms.runtime.engine import make_grads, mini_layout, model_spec
        from recjax.train.setup import make_model

        model = make_model(cfg, model_spec(cfg, spec))
        mini = mini_layout(model.layout, batch_size, spec.max_len)
        mini_model = Model(model.module, mini, model.microbatches)
        grads, grads_rows = make_grads(mini, mini_model)
        self._grads, self._grads_rows = jax.jit(grads), jax.jit(grads_rows)
        self.ctx = types.SimpleNamespace(cfg=cfg, mini_layout=mini, mini_model=mini_model)
        self.shard_names = shard_names
        self.fns: dict[str, Any] = {}
        self._held: dict[int, list] = {}  # worker -> its step's push, until `flush`

    def pid(self) -> int:
        return os.getpid()

    def compute(self, params, local, coalesce: bool, *parts) -> tuple:
        """``(metrics, dense grads, row grads of shard 0, ..., of shard S-1)``."""
        minis = {}
        for p in parts:
            minis.update(p)
        m, g, rows = (self._grads_rows if coalesce else self._grads)(params, minis, local)
        m, g, rows = jax.device_get((m, g, rows))
        return (m, g, *[{k: rows[k] for k in names} if names else None
                        for names in self.shard_names])

    def step(self, params, local, coalesce: bool, push: bool, shards: list,
             hold: int | None = None) -> tuple:
        """A worker's step with its embedding traffic made from this process: pull each
        shard's rows from its actor (`shards`: `RayEmbeddingPS.direct`, the rows as
        `wire_rows`), compute, and with `push` push each shard its row gradients (summed
        per row) and wait for them, so neither the rows nor the gradients pass through the
        driver, and only a batch's real rows travel (`pack_rows`). `params` may come as
        ``[reference]`` (a dense PS's pull still running): it is fetched after the shard
        pulls are sent, so the dense and the embedding pulls overlap instead of Ray
        resolving it before the call starts (10-11 ms from the driver's call to the step's
        start instead of 18-22 ms, dlrm_kaggle, B = 4096, 2-core VM). Returns ``((metrics,
        failed), dense grads, per shard: its real rows' gradient sums (`pack_rows`), or None
        when pushed here)``;
        `failed` maps a shard whose push found its actor dead to that push's real row sums
        (the driver restarts it and sends them again, `ShardServer.push_rows`). A shard
        that died under the pull raises `RayActorError` to the caller.

        With `hold` (a worker id; a straggler's step, see `RayWorker.compute`) the push is
        kept here, not sent, until the driver asks for it (`flush`) after the step's modelled
        slowdown: a role pushes after its `Work`, as the threaded backend's does."""
        ray = _ray()
        refs = [h.pull_rows.remote(wire, True) for h, wire in shards if h is not None]
        if isinstance(params, list):
            params = ray.get(params[0])
        rows = [unwire_rows(wire) if h is not None else None for h, wire in shards]
        pulled = iter(ray.get(refs))
        parts = [unpack_rows(next(pulled), r) for r in rows if r is not None]
        # pushed from here: one summed row per unique id, and only the real ones (`pack_rows`)
        m, g, *per = self.compute(params, local, coalesce or push, *parts)
        packed = {s: pack_rows(per[s], rows[s]) for s, (h, _) in enumerate(shards)
                  if h is not None}
        if not push:  # GBA: each shard's real row sums go to PS0 (its `push_sums` takes them)
            return ((m, {}), g, *[packed.get(s) for s in range(len(per))])
        held = [(s, h, wire, packed[s]) for s, (h, wire) in enumerate(shards) if h is not None]
        if hold is not None:
            self._held[hold] = held
            return ((m, {}), g, *[None] * len(per))
        return ((m, self._push(held)), g, *[None] * len(per))

    def flush(self, hold: int, handles: list) -> dict:
        """Send the push `step` kept for worker `hold` to each shard's actor as it is now
        (`handles[s]`: a shard may have been restarted since) and wait for it; returns
        `failed` as `step` does."""
        return self._push([(s, handles[s], wire, sums)
                           for s, _, wire, sums in self._held.pop(hold)])

    @staticmethod
    def _push(held: list) -> dict:
        """``[(shard, actor, wire rows, real row sums)]`` pushed, all sent before any is
        waited for; ``{shard: sums}`` of those whose actor was dead."""
        ray = _ray()
        sent = [(s, h.push_rows.remote(wire, sums), sums) for s, h, wire, sums in held]
        failed = {}
        for s, ref, sums in sent:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                failed[s] = sums  # the driver's retry: the same push through its proxy
        return failed

    def add(self, name: str, factory, *args) -> None:
        """Compile-on-call ``jax.jit(factory(ctx, *args))`` under `name` (see `call`)."""
        self.fns[name] = jax.jit(factory(self.ctx, *args))

    def call(self, name: str, *args) -> Any:
        return jax.device_get(self.fns[name](*args))


class Groups:
    """The worker-group actors of a run, created on first use; a group of `size` workers
    gets as many XLA threads."""

    def __init__(self, rt):
        self.rt, self.handles, self.pids, self.sizes = rt, {}, {}, {}
        self.respawns = 0

    def respawn(self, group: int) -> None:
        """Start group `group`'s process again (after it died)."""
        print(f"recjax: worker group {group}'s process died; starting it again", flush=True)
        self.handles.pop(group, None)
        self.respawns += 1
        self.get(group)

    def get(self, group: int, size: int = 0):
        """Group `group`'s actor (`size`: its workers, given by the first call; default 1)."""
        self.sizes.setdefault(group, size or 1)
        if group not in self.handles:
            rt = self.rt
            names = [sh.names for sh in rt.ps.shards]
            h = rt.cluster.spawn(ComputeServer, rt.cfg, rt.data.spec, rt.batch_size, names,
                                 concurrency=8, resource=rt.cfg.ray.worker_resource,
                                 xla_threads=self.sizes[group])
            self.handles[group] = h
            self.pids[group] = _ray().get(h.pid.remote())
        return self.handles[group]

    def warm_all(self, params, batch) -> None:
        """Compile every group's gradient functions (both variants) before the roles start."""
        ray = _ray()
        local, rows = batch
        n = 2 + len(self.rt.ps.shards)
        refs = []
        for h in self.handles.values():
            for coalesce in (False, True):
                parts = [ref for _, (_, ref) in self.rt.ps.pull_refs(rows, admit=False)]
                refs.append(h.compute.options(num_returns=n).remote(host_value(params), local,
                                                                   coalesce, *parts)[0])
        ray.get(refs)


class RemoteFn:
    """A jitted function run by a worker group's actor: a blocking call, numpy in and out.

    If the group's process dies, it is started again, the function rebuilt there and the call
    retried once (counted in `Groups.respawns`): a role whose step cannot simply be dropped
    (Persia's NN workers, whose activation gradients the embedding workers wait for) goes on.
    """

    def __init__(self, groups: Groups, group: int, name: str, factory, args: tuple):
        self.groups, self.group, self.name = groups, group, name
        self.factory, self.args = factory, args
        groups.get(group).add.remote(name, factory, *args)

    def __call__(self, *args):
        ray = _ray()
        args = tuple(map(host_value, args))
        for attempt in (0, 1):
            try:
                return ray.get(self.groups.get(self.group).call.remote(self.name, *args))
            except ray.exceptions.RayActorError as e:
                if attempt:
                    raise WorkerLost(f"{self.name}: {e}") from e
                self.groups.respawn(self.group)
                self.groups.get(self.group).add.remote(self.name, self.factory, *self.args)


class RayWorker:
    """`engine.Worker` whose compute runs in its group's actor (see `Runtime.worker`).

    The driver makes one call per step (`ComputeServer.step`): the actor pulls the batch's
    rows from each shard's actor and (async PS, ShadowSync) pushes each shard its row
    gradients, one call per (batch, shard) each way, so the rows and gradients go from process
    to process without passing through the driver. A straggler's step (factor > 1) keeps its
    push in the actor until `push`, which the role calls after the step's `Work` (its modelled
    slowdown), as a threaded worker pushes: one more call for such a step
    (`ComputeServer.flush`). For GBA the row gradients come back as one reference per shard
    (`ShardGrads`) for PS0. With ``rt.dense_on_actor`` the dense gradient
    stays a reference too (its consumer, a hosted dense PS or GBA's PS0, is an actor). A shard
    that died under the step is restarted by the driver's `ShardProxy`, and the step redone
    through it.
    """

    def __init__(self, rt, wid: int, supply, group: int, group_size: int = 1):
        from algorithms.runtime.engine import Counters, record_step

        self.rt, self.wid, self.supply, self.group = rt, wid, supply, group
        self._record = record_step  # (engine is imported lazily: shard actors load this module)
        self.counters = Counters(shard_bytes=[0] * rt.ps.num_shards)
        self.handle = rt.groups.get(group, group_size)
        self._kill_at = parse_kill(rt.cfg.ray.kill).get(("worker", wid), 0)

    def take(self):
        return self.supply.take(self.wid)

    def compute(self, params, item: tuple, it: int, coalesce: bool = False):
        """The step in the group's actor (`ComputeServer.step`). Without `coalesce` (async
        PS, ShadowSync) the actor also pushes the row gradients, and `push` only accounts for
        them; with it (GBA, whose PS0 aggregates them) they come back as `ShardGrads`."""
        rt, ray = self.rt, _ray()
        _, (local, rows) = item
        if self._kill_at and it + 1 == self._kill_at:
            self._kill_at = 0
            sigkill(self.handle, self.rt.groups.pids[self.group])
        n, push = 2 + len(rt.ps.shards), not coalesce
        # A straggler's push waits in the actor for its slowdown (`push`), as a threaded
        # worker pushes after its `Work`: other workers must not see the gradients of a
        # modelled slow step before its modelled end. At factor 1 nothing but the emulated
        # links' hold sleeps between the step and its push, so the actor pushes at once (one
        # call fewer per step).
        hold = self.wid if push and rt.stragglers.factor(self.wid, it) > 1 else None
        try:
            try:
                if push and hold is None:
                    self._will_push()
                # a dense pull's reference goes nested, resolved by the actor (`step`)
                dense = [params] if isinstance(params, ray.ObjectRef) else host_value(params)
                outs = self.handle.step.options(num_returns=n).remote(
                    dense, local, coalesce, push, rt.ps.direct(rows), hold)
                m, failed = ray.get(outs[0])
            except ray.exceptions.RayActorError:
                if not self._alive():
                    raise
                # a PS shard died under the pull: pull again through the proxies (which
                # restart it) and redo the step on the rows they return; the driver pushes
                push, failed = False, {}
                parts = [rt.ps._part(rt.ps.pull(rows), sh.names) for sh in rt.ps.shards
                         if sh.names]
                outs = self.handle.compute.options(num_returns=n).remote(
                    host_value(params), local, coalesce, *parts)
                m = ray.get(outs[0])
            g_params = outs[1] if rt.dense_on_actor else ray.get(outs[1])
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(f"worker {self.wid} (group {self.group}) died: {e}") from e
        work = self._record(rt, self.wid, self.counters, item, m, it)
        if push:
            pending = _Pushed(rows, failed, held=hold is not None)
        else:
            pending = (rows, ShardGrads(tuple(outs[2:])))
        return g_params, pending, work

    def _will_push(self) -> None:
        for sh in self.rt.ps.shards:
            if sh.names:
                sh.will_push()

    def _alive(self) -> bool:
        ray = _ray()
        try:
            ray.get(self.handle.pid.remote(), timeout=10)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    def push(self, pending) -> None:
        ps, ray = self.rt.ps, _ray()
        if isinstance(pending, _Pushed) and pending.held:  # a straggler's: the actor sends it now
            self._will_push()
            handles = [sh.handle if sh.names else None for sh in ps.shards]
            try:
                failed = ray.get(self.handle.flush.remote(self.wid, handles))
            except ray.exceptions.RayActorError as e:
                raise WorkerLost(f"worker {self.wid} (group {self.group}) died before its "
                                 f"push: {e}") from e
            pending = _Pushed(pending.rows, failed)
        if isinstance(pending, _Pushed):  # pushed by the actor: account, and redo a failed one
            for s, sh in enumerate(ps.shards):
                if s in pending.failed:
                    sh.call("push_rows", wire_rows(ps._part(pending.rows, sh.names)),
                            pending.failed[s])
                elif sh.names:
                    sh.pushed()
        else:
            ps.push(*pending)
        self.counters.iterations += 1


@dataclasses.dataclass(frozen=True)
class _Pushed:
    """A step whose row gradients the worker actor pushed itself; `failed`: shard -> the real
    row sums (`pack_rows`) of a push that found the shard's actor dead."""

    rows: dict
    failed: dict
    held: bool = False  # not pushed yet: kept in the actor until `RayWorker.push` (a straggler)
