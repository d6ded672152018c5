"""The embedding PS of the Ray backend: one actor per shard (docs/distributed.md §4).

`ShardServer` is one shard's actor body (a `ps.EmbeddingShard` or `ps.LruShard`); `ShardProxy`
the driver's handle of it (calls, snapshots, restarts, kill injection); `RayEmbeddingPS`
`ps.EmbeddingPS`'s interface over the proxies. Elsewhere: the cluster (``ray_backend.py``),
what travels and hosted servers (``ray_wire.py``), worker groups (``ray_workers.py``), a
checkpoint's per-shard parts (``ray_parts.py``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import jax
import numpy as np

from algorithms.runtime import ps as ps_lib
from algorithms.runtime import ray_parts
from algorithms.runtime.ray_backend import Cluster, _ray, parse_kill, sigkill
from algorithms.runtime.ray_wire import ShardGrads, pack_rows, unpack_sums, unwire_rows, wire_rows
from recjax.config import Config, RayConfig
from recjax.embeddings import init_tables, make_sparse_optimizer
from recjax.embeddings.dynamic import LruStore
from recjax.train.setup import init_scale


class PsFailed(OSError):
    """A PS shard died more often than ``ray.max_ps_restarts`` (or where no restart is made):
    the engine saves a checkpoint from the other shards and this one's last snapshot."""


class ShardServer(ray_parts.PartHolder):
    """The actor body of one embedding PS shard.

    Args:
      index: the shard number.
      sparse: the sparse optimizer's config (the optimizer is rebuilt here).
      tables, slots: the shard's tables (fixed store).
      lru: ``None`` or the LruStore keywords, with ``dims`` (``name -> D``) of its tables.
      init: ``None``, or the `init_tables` arguments (``layout`` of this shard's tables,
        ``seed``, ``scale``, ``by_id``): the shard draws its initial tables itself, the values
        the driver's `build` would draw (each table's generator is seeded by its name), so no
        process holds more than its own shard's tables.
    """

    def __init__(self, index: int, sparse, tables: dict, slots: dict, lru: dict | None,
                 init: dict | None = None):
        opt = make_sparse_optimizer(sparse)
        self.lru = lru is not None
        if init is not None:
            tables = init_tables(**init)
            slots = {k: jax.device_get(opt.init(jax.numpy.asarray(v))) for k, v in tables.items()}
        if self.lru:
            kw = dict(lru)
            dims = kw.pop("dims")
            self.shard = ps_lib.LruShard(index, {name: LruStore(name, d, opt=opt, **kw)
                                                 for name, d in dims.items()})
        else:
            self.shard = ps_lib.EmbeddingShard(index, tables, slots, opt)

    def pid(self) -> int:
        return os.getpid()

    def pull(self, rows: ps_lib.Rows, admit: bool = True) -> dict:
        return self.shard.pull(rows, admit) if self.lru else self.shard.pull(rows)

    def push(self, rows: ps_lib.Rows, grads: dict) -> None:
        self.shard.push(rows, grads)

    def pull_rows(self, wire: dict, admit: bool = True) -> dict:
        """`pull` as a worker actor asks for it and gets it: the real ids in, their rows out
        (`wire_rows`, `pack_rows`). A fixed table's pull gathers the real rows only."""
        if self.lru:
            rows = unwire_rows(wire)
            return pack_rows(self.pull(rows, admit), rows)
        return self.shard.pull({k: (real, real.size) for k, (real, _, _) in wire.items()})

    def push_rows(self, wire: dict, sums: dict) -> None:
        """`push` of a worker actor's per-row summed gradients, real rows only (`unpack_sums`)."""
        rows = unwire_rows(wire)
        self.shard.push(rows, unpack_sums(sums, rows))

    def warm(self, rows: ps_lib.Rows, grads: dict) -> None:
        self.shard.warm(rows, grads)

    def snapshot(self) -> tuple:
        return self.shard.snapshot()

    def restore(self, snap: tuple) -> None:
        self.shard.restore(snap)

    def set_tables(self, tables: dict, slots: dict) -> None:
        """Replace rows and slots (a resumed state), keeping the optimizer step."""
        self.shard.restore((tables, slots, self.shard.step))

    def wipe(self) -> None:
        self.shard.wipe()

    def counters(self) -> dict:
        return self.shard.counters()

    def get_step(self) -> int:
        return self.shard.step

    def set_step(self, step: int) -> None:
        self.shard.step = step


# `ShardServer` calls that set a shard's state wholesale: a snapshot is taken right after them
_RESETS = ("restore", "set_tables", "set_step", "load_part")
_PUSHES = ("push", "push_rows")  # the calls that update rows: counted, and killed at (`ray.kill`)


class ShardProxy:
    """The driver's handle of one PS shard actor: calls, snapshots, restarts.

    Every request goes through `submit` then `result`; a request whose actor died restarts
    the shard from its last snapshot (once, whichever thread notices first) and is retried.
    """

    def __init__(self, cluster: Cluster | None, index: int, names: list[str], args: tuple,
                 rc: RayConfig, kill_at: int = 0):
        self.index, self.names, self.tables = index, names, names
        self._cluster, self._args, self._rc, self._kill_at = cluster, args, rc, kill_at
        self.restarts = self.pushes_lost = self.pushes = self._submitted = 0
        self._lock = threading.Lock()
        self._gen = 0
        self._snap = self._prev = None
        self._snap_at = self._prev_at = 0
        if cluster is not None and names:
            self.handle, self.pid = self._spawn()
            self._snapshot_now(0)
            # a restart restores a snapshot into an empty shard: the driver keeps no tables
            self._args = (*args[:2], {}, {}, args[4], None)

    def __getstate__(self):  # a client in another actor (GBA's PS0): no restarts there
        return {"index": self.index, "names": self.names, "tables": self.tables,
                "handle": getattr(self, "handle", None), "_gen": self._gen}

    def __setstate__(self, state):
        self.__dict__.update(state, _cluster=None, _lock=threading.Lock(), _kill_at=0,
                             restarts=0, pushes_lost=0, pushes=0, _snap=None, _prev=None)

    def _spawn(self) -> tuple[Any, int]:
        handle = self._cluster.spawn(ShardServer, *self._args, concurrency=self._rc.ps_concurrency,
                                     resource=self._rc.ps_resource)
        return handle, _ray().get(handle.pid.remote())

    def submit(self, method: str, *args) -> tuple[int, Any]:
        if method in _PUSHES and self._kill_at:
            with self._lock:  # pushes of several workers are submitted concurrently
                self._submitted += 1
                kill = self._submitted == self._kill_at
            if kill:
                self._kill_at = 0
                sigkill(self.handle, self.pid)
        return self._gen, getattr(self.handle, method).remote(*args)

    def result(self, sent: tuple[int, Any], method: str, *args) -> Any:
        ray = _ray()
        gen, ref = sent
        while True:
            try:
                out = ray.get(ref)
                break
            except ray.exceptions.RayActorError as e:
                self._restart(gen, e)
                gen, ref = self.submit(method, *args)
        if method in _PUSHES:
            self._pushed()
        elif method in _RESETS:
            self._resnapshot()
        return out

    def call(self, method: str, *args) -> Any:
        return self.result(self.submit(method, *args), method, *args)

    def _resnapshot(self) -> None:
        """The shard's state was set wholesale (a resumed checkpoint, GBA's undone probe, the
        optimizer step): a restart goes back to this state, not to an older snapshot."""
        if self._cluster is not None:
            with self._lock:
                self._snapshot_now(self.pushes)

    def _snapshot_now(self, at: int) -> None:
        """The only snapshot from now on (the state after push `at`), waited for: taken at
        the start, after a wholesale set and after a restart, all rare, so that a death right
        after still finds it."""
        self._snap, self._snap_at, self._prev = self.handle.snapshot.remote(), at, None
        _ray().wait([self._snap])

    def will_push(self) -> None:
        """A worker actor is about to push to this shard itself (`ComputeServer.step`, or
        `flush` for a straggler's step): the kill injection counts it as `submit` counts the
        driver's pushes."""
        if self._kill_at:
            with self._lock:
                self._submitted += 1
                kill = self._submitted == self._kill_at
            if kill:
                self._kill_at = 0
                sigkill(self.handle, self.pid)

    def pushed(self) -> None:
        """A worker actor's push to this shard was applied (counts toward a snapshot)."""
        self._pushed()

    def _pushed(self) -> None:
        with self._lock:
            self.pushes += 1
            if self._cluster is not None and self.pushes - self._snap_at >= self._rc.snapshot_every:
                self._prev, self._prev_at = self._snap, self._snap_at
                self._snap, self._snap_at = self.handle.snapshot.remote(), self.pushes

    def _restart(self, gen: int, error: Exception) -> None:
        ray = _ray()
        with self._lock:
            if gen != self._gen:  # another thread restarted it already
                return
            if self._cluster is None:
                raise PsFailed(f"embedding PS shard {self.index} died ({error}); the process "
                               "that restarts it is the driver's") from error
            if self.restarts >= self._rc.max_ps_restarts:
                raise PsFailed(f"embedding PS shard {self.index} died {self.restarts + 1} times "
                               f"(ray.max_ps_restarts={self._rc.max_ps_restarts}); the run stops "
                               "with the checkpoint it has") from error
            snap, at = None, 0
            for ref, when in ((self._snap, self._snap_at), (self._prev, self._prev_at)):
                if ref is None:
                    continue
                try:
                    snap, at = ray.get(ref), when
                    break
                except ray.exceptions.RayError:  # the snapshot died with the actor
                    continue
            if snap is None:
                raise PsFailed(f"embedding PS shard {self.index} died and no snapshot of it "
                               "survived") from error
            # published only once restored: a request of another thread must not reach the
            # new actor before its rows do
            handle, pid = self._spawn()
            ray.get(handle.restore.remote(snap))
            self.handle, self.pid = handle, pid
            self.restarts += 1
            self.pushes_lost += self.pushes - at
            self.pushes = at
            self._snapshot_now(at)
            self._gen += 1
            print(f"recjax: embedding PS shard {self.index} died; restarted from its snapshot "
                  f"at push {at} ({self.pushes_lost} pushes lost so far)", flush=True)

    def pushed_by_actors(self, n: int) -> None:
        """`n` pushes of a role run in an actor (``ray_roles.py``; per chunk), and a snapshot
        if one is due."""
        if n <= 0:
            return
        with self._lock:
            self.pushes += n
            if self._cluster is not None and self.pushes - self._snap_at >= self._rc.snapshot_every:
                self._prev, self._prev_at = self._snap, self._snap_at
                self._snap, self._snap_at = self.handle.snapshot.remote(), self.pushes

    def pushes_before_kill(self) -> int | None:
        """Pushes before ``ps:S@I`` is due (roles in the actors: at the chunk boundary before
        push I), or None; at 0 the shard is killed now, after the snapshot due there."""
        with self._lock:  # each worker's driver thread asks
            left = self._kill_at - 1 - self.pushes if self._kill_at else None
            if left is not None and left <= 0:
                self._kill_at, left = 0, None
                if self._snap is not None:  # a snapshot due at this boundary is taken first
                    _ray().wait([self._snap])
                sigkill(self.handle, self.pid)
        return left

    @property
    def generation(self) -> int:  # restarts so far: the handle changes with each
        return self._gen

    def revive(self) -> None:
        """A worker actor found this shard's actor dead: restart it from its snapshot (once,
        whichever caller comes first; a live actor just answers)."""
        self.call("get_step")

    def last_snapshot(self) -> tuple:
        """The newest snapshot that survived (for a checkpoint after `PsFailed`)."""
        ray = _ray()
        for ref in (self._snap, self._prev):
            if ref is not None:
                try:
                    return ray.get(ref)
                except ray.exceptions.RayError:
                    continue
        raise PsFailed(f"embedding PS shard {self.index}: no snapshot survived")

    # the EmbeddingShard interface the algorithms use (Persia's recovery, GBA's warm-up)
    def pull(self, rows, admit: bool = True):
        return self.call("pull", rows, admit)

    def push(self, rows, grads) -> None:
        self.call("push", rows, grads)

    def snapshot(self):
        return self.call("snapshot")

    def restore(self, snap) -> None:
        self.call("restore", snap)

    def wipe(self) -> None:
        self.call("wipe")

    def warm(self, rows, grads) -> None:
        self.call("warm", rows, grads)

    def counters(self) -> dict:
        return self.call("counters")

    @property
    def step(self) -> int:
        return self.call("get_step")

    @step.setter
    def step(self, value: int) -> None:
        self.call("set_step", int(value))


class RayEmbeddingPS(ps_lib.EmbeddingPS):
    """`ps.EmbeddingPS` over `ShardServer` actors (same arguments, plus the run's cluster and
    config; `tables` None: each shard reads its own from a checkpoint, `ray_parts.ShardLoader`);
    its pulls and pushes fan out to the shards at once and wait for all of them."""

    def __init__(self, cluster: Cluster, cfg: Config, layout, tables: dict | None, slots,
                 placement: dict[str, int], shards: int, lru: dict | None = None):
        self.layout, self.placement, self.num_shards = layout, placement, shards
        self.lru = lru is not None
        self._dim = {t.name: t.embedding_dim for t in layout.tables}
        kills = parse_kill(cfg.ray.kill)
        self.shards = []
        for s in range(shards):
            names = [t.name for t in layout.tables if placement[t.name] == s]
            if self.lru:
                args = (s, cfg.sparse, {}, {}, dict(lru, dims={n: self._dim[n] for n in names}),
                        None)
            elif tables is None:
                args = (s, cfg.sparse, {}, {}, None, None)
            elif any(isinstance(tables[k], jax.ShapeDtypeStruct) for k in names):
                # a fresh run: the shard draws its own tables (`init_state(tables=False)`)
                init = {"layout": dataclasses.replace(layout, tables=tuple(
                            t for t in layout.tables if t.name in names)),
                        "seed": cfg.train.seed, "scale": init_scale(cfg),
                        "by_id": cfg.embed.init_by_id}
                args = (s, cfg.sparse, {}, {}, None, init)
            else:
                args = (s, cfg.sparse, {k: np.asarray(tables[k]) for k in names},
                        {k: jax.device_get(slots[k]) for k in names}, None, None)
            self.shards.append(ShardProxy(cluster, s, names, args, cfg.ray,
                                          kills.get(("ps", s), 0)))

    @staticmethod
    def _part(d: dict, names: list[str]) -> dict:
        return {k: d[k] for k in names}

    def pull_refs(self, rows: ps_lib.Rows, admit: bool = True) -> list:
        """One pull per shard with tables, not waited for: ``[(shard, sent)]``."""
        return [(sh, sh.submit("pull", self._part(rows, sh.names), admit))
                for sh in self.shards if sh.names]

    def direct(self, rows: ps_lib.Rows) -> list:
        """``[(actor handle, the shard's rows as `wire_rows`) or (None, None)]`` per shard:
        what a worker actor needs to pull from and push to the shards itself
        (`ComputeServer.step`)."""
        return [(sh.handle, wire_rows(self._part(rows, sh.names))) if sh.names else (None, None)
                for sh in self.shards]

    def pull(self, rows: ps_lib.Rows, admit: bool = True) -> dict:
        out = {}
        for sh, sent in self.pull_refs(rows, admit):
            out.update(sh.result(sent, "pull", self._part(rows, sh.names), admit))
        return out

    def _each_shard(self, method: str, args_of) -> None:
        """``method(*args_of(shard))`` on every shard with tables, all sent before any is
        waited for (a dead shard is restarted and its call retried by its proxy)."""
        sent = [(sh, sh.submit(method, *args), args)
                for sh in self.shards if sh.names for args in [args_of(sh)]]
        for sh, s, args in sent:
            sh.result(s, method, *args)

    def push(self, rows: ps_lib.Rows, grads) -> None:
        """`ps.EmbeddingPS.push`; `grads` may be `ShardGrads` (a worker actor's gradients as
        one reference per shard: its step's redo after a shard died under the pull), which
        go from the worker's process to the shard's without passing through this one."""
        def args_of(sh):
            part = grads.refs[sh.index] if isinstance(grads, ShardGrads) else {
                k: jax.device_get(grads[k]) for k in sh.names}
            return self._part(rows, sh.names), part

        self._each_shard("push", args_of)

    def push_sums(self, rows: ps_lib.Rows, sums: dict) -> None:
        """`ps.EmbeddingPS.push_sums`, one call per shard that carries its n real ids and rows
        only (`wire_rows`, `pack_rows`): GBA's PS0 pushes an update's rows this way, which
        padded to the update's fixed M would be mostly zeros."""
        def args_of(sh):
            part = self._part(rows, sh.names)
            return wire_rows(part), pack_rows({k: np.asarray(sums[k]) for k in sh.names}, part)

        self._each_shard("push_rows", args_of)

    def warm(self, rows: ps_lib.Rows, grads: dict) -> None:
        for sh in self.shards:
            if sh.names:
                sh.warm(self._part(rows, sh.names), self._part(jax.device_get(grads), sh.names))

    def snapshot(self) -> tuple[dict, dict]:
        tables, slots = {}, {}
        for sh in self.shards:
            if not sh.names:
                continue
            try:
                t, sl, _ = sh.snapshot()
            except PsFailed:  # a shard that is gone for good: its last snapshot
                t, sl, _ = sh.last_snapshot()
            if self.lru:
                for k, v in t.items():
                    tables[k], slots[k] = ps_lib.lru_state(v)
            else:
                tables.update(t)
                slots.update(sl)
        return ({t.name: tables[t.name] for t in self.layout.tables},
                {t.name: slots[t.name] for t in self.layout.tables})

    def restore(self, tables: dict, slots: dict) -> None:
        for sh in self.shards:
            if not sh.names:
                continue
            if self.lru:
                snaps = {k: ps_lib.lru_snapshot(tables[k], jax.device_get(slots[k]))
                         for k in sh.names}
                sh.restore((snaps, {}, sh.step))
            else:
                sh.call("set_tables", {k: np.asarray(tables[k]) for k in sh.names},
                        {k: jax.device_get(slots[k]) for k in sh.names})

    def fault_counters(self) -> dict:
        return {"ps_restarts": sum(sh.restarts for sh in self.shards),
                "ps_pushes_lost": sum(sh.pushes_lost for sh in self.shards)}

