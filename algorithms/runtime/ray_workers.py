"""The worker groups of the Ray backend (docs/distributed.md §4): one actor process per group.

`ComputeServer` is the actor body of a worker group (single-process JAX: the run's gradient
functions rebuilt from the config); `Groups` creates them on first use; `RayWorker` is
`worker.Worker` over one (one call per step, the actor pulling from and pushing to the shard
actors itself); `RemoteFn` runs a jitted function there (Persia's NN workers). The cluster
is in ``ray_backend.py``, the wire format of rows in ``ray_wire.py``, the PS shards in
``ray_ps.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import types
from typing import Any

import jax

from algorithms.runtime.clock import WorkerLost
from algorithms.runtime.ray_backend import _ray, parse_kill, sigkill
from algorithms.runtime.ray_wire import (
    ShardGrads,
    host_value,
    pack_rows,
    unpack_rows,
    unwire_rows,
    wire_rows,
)
from recjax.config import Config
from recjax.features import FeatureSpec
from recjax.train.step import Model


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
        from algorithms.runtime.worker import make_grads, mini_layout, model_spec
        from recjax.train.setup import make_model

        model = make_model(cfg, model_spec(cfg, spec))
        self.layout = model.layout  # the batches' (a role run here localizes them)
        mini = mini_layout(model.layout, batch_size, spec.max_len)
        mini_model = Model(model.module, mini, model.microbatches)
        grads, grads_rows = make_grads(mini, mini_model)
        self._grads, self._grads_rows = jax.jit(grads), jax.jit(grads_rows)
        self.ctx = types.SimpleNamespace(cfg=cfg, mini_layout=mini, mini_model=mini_model)
        self.shard_names = shard_names
        self.fns: dict[str, Any] = {}
        _HERE[:] = [self]  # this process's group (a `RemoteFn` handed to a role run here)
        self._held: dict[int, list] = {}  # worker -> its step's push, until `flush`

    def pid(self) -> int:
        return os.getpid()

    def compute(self, params, local, coalesce: bool, *parts) -> tuple:
        """``((metrics, seconds), dense grads, row grads of shard 0, ..., of shard S-1)``;
        `seconds`: the gradient computation's wall time here (what a straggler's factor
        multiplies, `clock.Work.measured`)."""
        minis = {}
        for p in parts:
            minis.update(p)
        t0 = time.perf_counter()
        m, g, rows = (self._grads_rows if coalesce else self._grads)(params, minis, local)
        m, g, rows = jax.device_get((m, g, rows))
        return ((m, time.perf_counter() - t0), g,
                *[{k: rows[k] for k in names} if names else None for names in self.shard_names])

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
        failed, seconds), dense grads, per shard: its real rows' gradient sums (`pack_rows`),
        or None when pushed here)``; `seconds` is the gradient computation's (`compute`);
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
        (m, secs), g, *per = self.compute(params, local, coalesce or push, *parts)
        packed = {s: pack_rows(per[s], rows[s]) for s, (h, _) in enumerate(shards)
                  if h is not None}
        if not push:  # GBA: each shard's real row sums go to PS0 (its `push_sums` takes them)
            return ((m, {}, secs), g, *[packed.get(s) for s in range(len(per))])
        held = [(s, h, wire, packed[s]) for s, (h, wire) in enumerate(shards) if h is not None]
        if hold is not None:
            self._held[hold] = held
            return ((m, {}, secs), g, *[None] * len(per))
        return ((m, self._push(held), secs), g, *[None] * len(per))

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

    def call(self, name: str, *args) -> tuple[Any, float]:
        """``(fns[name](*args) as numpy, its computation's seconds here)``: `RemoteFn.timed`
        scales a straggler by the function's time in this process, not by the round trip."""
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.fns[name](*args))
        secs = time.perf_counter() - t0
        return jax.device_get(out), secs


class Groups:
    """The worker-group actors of a run, created on first use; a group of `size` workers
    gets as many XLA threads."""

    body: type = ComputeServer  # the actors' class (`ray_roles.RoleServer`: roles run there)

    def __init__(self, rt, cluster):
        self.rt, self.cluster, self.handles, self.pids, self.sizes = rt, cluster, {}, {}, {}
        self.members: dict[int, set] = {}  # group -> its workers (roles in the actors)
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
            # a call per role may wait there (`RoleServer.advance`): its workers and a shadow
            h = self.cluster.spawn(self.body, rt.cfg, rt.data.spec, rt.batch_size, names,
                                 concurrency=9 + self.sizes[group],
                                 resource=rt.cfg.ray.worker_resource,
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
    """A jitted function run by a worker group's actor: a blocking call, numpy in and out
    (``fn(*args)``, or ``fn.timed(*args)`` with the function's seconds in the actor).

    If the group's process dies, it is started again, the function rebuilt there and the call
    retried once (counted in `Groups.respawns`): a role whose step cannot simply be dropped
    (Persia's NN workers, whose activation gradients the embedding workers wait for) goes on.
    """

    def __init__(self, groups: Groups, group: int, name: str, factory, args: tuple):
        self.groups, self.group, self.name = groups, group, name
        self.factory, self.args = factory, args
        self._build()

    def __reduce__(self):
        """Handed to a role run in the group's actor (``ray_roles.py``): the function there,
        called in that process (`_Here`), not through a call to itself."""
        return _here, (self.name,)

    def _build(self) -> None:
        """Build the function in the group's actor, and wait for it: the actor serves calls
        concurrently, so a call sent after an `add` that was not waited for could run
        before it (a ``KeyError`` in the actor, seen once in a dozen runs of
        tests/test_ray_backend.py's `test_a_remote_fn_times_its_computation_in_the_actor`)."""
        _ray().get(self.groups.get(self.group).add.remote(self.name, self.factory, *self.args))

    def __call__(self, *args):
        return self.timed(*args)[0]

    def timed(self, *args) -> tuple[Any, float]:
        """``(the result, its computation's seconds in the actor)`` (`worker.LocalFn.timed`)."""
        ray = _ray()
        args = tuple(map(host_value, args))
        for attempt in (0, 1):
            try:
                return ray.get(self.groups.get(self.group).call.remote(self.name, *args))
            except ray.exceptions.RayActorError as e:
                if attempt:
                    raise WorkerLost(f"{self.name}: {e}") from e
                self.groups.respawn(self.group)
                self._build()


class RayWorker:
    """`worker.Worker` whose compute runs in its group's actor (`RayPlacement.worker`).

    The driver makes one call per step (`ComputeServer.step`): the actor pulls the batch's
    rows from each shard's actor and (async PS, ShadowSync) pushes each shard its row
    gradients, one call per (batch, shard) each way, so the rows and gradients go from process
    to process without passing through the driver. A straggler's step (factor > 1) keeps its
    push in the actor until `push`, which the role calls after the step's `Work` (its modelled
    slowdown), as a threaded worker pushes: one more call for such a step
    (`ComputeServer.flush`). For GBA the row gradients come back as one reference per shard
    (`ShardGrads`) for PS0. With the placement's ``dense_on_actor`` the dense gradient
    stays a reference too (its consumer, a hosted server such as GBA's PS0, is an actor). A shard
    that died under the step is restarted by the driver's `ShardProxy`, and the step redone
    through it.
    """

    def __init__(self, rt, wid: int, supply, group: int, group_size: int = 1):
        from algorithms.runtime.worker import Counters, record_step

        self.rt, self.wid, self.supply, self.group = rt, wid, supply, group
        self._record = record_step  # (imported lazily: shard actors load this module)
        self.counters = Counters(shard_bytes=[0] * rt.ps.num_shards)
        self.handle = rt.placement.groups.get(group, group_size)
        self._kill_at = parse_kill(rt.cfg.ray.kill).get(("worker", wid), 0)

    def take(self):
        return self.supply.take(self.wid)

    @staticmethod
    def send(message):
        """`worker.Worker.send`: its role runs here, the message stays as it is."""
        return message

    receive = send

    def compute(self, params, item: tuple, it: int, coalesce: bool = False):
        """The step in the group's actor (`ComputeServer.step`). Without `coalesce` (async
        PS, ShadowSync) the actor also pushes the row gradients, and `push` only accounts for
        them; with it (GBA, whose PS0 aggregates them) they come back as `ShardGrads`."""
        rt, ray = self.rt, _ray()
        _, (local, rows) = item
        if self._kill_at and it + 1 == self._kill_at:
            self._kill_at = 0
            sigkill(self.handle, rt.placement.groups.pids[self.group])
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
                m, failed, secs = ray.get(outs[0])
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
                m, secs = ray.get(outs[0])
            g_params = outs[1] if rt.placement.dense_on_actor else ray.get(outs[1])
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(f"worker {self.wid} (group {self.group}) died: {e}") from e
        work = self._record(rt, self.wid, self.counters, item, m, it, secs)
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


_HERE: list = []  # the `ComputeServer` of this process, in a worker group's actor


def _here(name: str) -> _Here:
    if not _HERE or name not in _HERE[0].fns:
        raise RuntimeError(f"{name} was built in another worker group's actor than the role it "
                           "was handed to; a role may call the functions of its own group only")
    return _Here(_HERE[0], name)


class _Here:
    """A `RemoteFn` in its group's actor: ``fn(*args)``, ``fn.timed(*args)`` as
    `worker.LocalFn`, computed here (`ComputeServer.call`)."""

    def __init__(self, server: ComputeServer, name: str):
        self.server, self.name = server, name

    def __call__(self, *args):
        return self.server.call(self.name, *args)[0]

    def timed(self, *args) -> tuple[Any, float]:
        return self.server.call(self.name, *args)

