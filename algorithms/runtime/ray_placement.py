"""The engine's placement under ``--backend ray`` (`placement.Placement`; docs/distributed.md).

The embedding PS shards (``ray_ps.py``), each worker group's compute (``ray_workers.py``) and
the servers the roles share (``ray_wire.Hosted``) are actors of the run's Ray instance
(``ray_backend.Cluster``); the roles run in the driver's threads, or (``--ray.roles actors``,
`ray_role_driver.in_actors`) each worker's role runs in its actor (``ray_roles.py``)
and the driver hands out chunks of steps. The instance's vital
processes are watched: `check` raises when one died (`ray_backend.ControlLost`: the actors still
hold the state, the run checkpoints it; `segments.StateLost`: it does not).
"""

from __future__ import annotations

from typing import Any

import jax

from algorithms.runtime import (
    dense_blocks,
    ray_backend,
    ray_dense,
    ray_parts,
    ray_ps,
    ray_role_driver,
    ray_role_worker,
    ray_roles,
    ray_wire,
    ray_workers,
)
from algorithms.runtime import ps as ps_lib
from algorithms.runtime.dense_blocks import pick
from algorithms.runtime.segments import StateLost, with_latest
from algorithms.runtime.worker import LocalFn, Worker, companion_here

Runtime = Any  # `engine.Runtime` (not imported: the engine imports the placement)


class RayPlacement:
    """PS shards, worker groups and hosted servers as Ray actors (see the module docstring).

    Attributes:
      cluster: the run's `ray_backend.Cluster`.
      groups: the worker-group actors (`ray_workers.Groups`), made on first use.
      dense_on_actor: the workers' dense gradients go to a hosted server (GBA's PS0): a
        worker hands them on as object references, actor to actor.
      in_actors: the workers' roles run in their actors (``ray_roles.py``).
    """

    name = "ray"
    tables_here = False  # each shard's actor draws its own tables
    stop_saving = (KeyboardInterrupt, ray_ps.PsFailed, ray_backend.ControlLost)

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.cluster = ray_backend.Cluster(rt.cfg.ray, rt.cfg.train.out)
        self.groups = ray_workers.Groups(rt, self.cluster)
        self.in_actors = ray_role_driver.in_actors(rt.cfg)
        self.final_tables = rt.cfg.ray.final_tables
        # GBA's step is a read of PS0's actor: one a chunk, not one a 50 ms poll (its CPU in
        # the driver was 4-9 ms a second); the actors' counters change per chunk anyway
        self.step_poll_s = rt.cfg.ray.chunk_s
        # with the roles in the actors nothing the driver reads changes within a chunk: the
        # main thread's 50 ms poll cost ~1 ms of its CPU per worker step at 1 slow worker
        # (docs/performance.md); it looks 4 times a chunk, at most every 0.2 s
        self.poll_s = min(0.2, rt.cfg.ray.chunk_s / 4) if self.in_actors else 0.05
        self.data_here = not self.in_actors
        if self.in_actors:
            self.groups.body = ray_roles.RoleServer
        self.dense_on_actor = False
        self.cut = False  # this interval cut a dense server into blocks (--ray.dense_shards)
        # the actors of the shared servers (`host`) of this interval, and of those before it,
        # whose processes the next interval's servers are built in: class -> handles
        self.hosted: list = []
        self.spare: dict[type, list] = {}
        self._fns: dict = {}

    def make_ps(self, layout, sparse_opt, tables, slots, table_shard, shards, lru):
        # each shard's actor rebuilds the sparse optimizer from the config
        return ray_ps.RayEmbeddingPS(self.cluster, self.rt.cfg, layout, tables, slots,
                                     table_shard, shards, lru=lru)

    def host(self, cls, factory, *args, dense_grads=False, near_roles=False, **proxy):
        """``factory(*args)`` built in an actor of its own, behind a `ray_wire.Hosted` proxy;
        its actor is watched: it holds state that is not restarted. `near_roles`: only where
        the roles run in their actors (else built here: ShadowSync's EASGD sync PS)."""
        if near_roles and not self.in_actors:
            return factory(*args)
        if self.spare.get(cls):  # an earlier interval's process: no new process, no import
            handle, ray = self.spare[cls].pop(), ray_backend._ray()
            try:
                ray.get(handle.rebuild.remote(factory, *args))
            except ray.exceptions.RayActorError as e:  # (between two intervals: checkpointed)
                raise with_latest(StateLost(f"the Ray actor of {cls.__name__} died as the next "
                                            "checkpoint interval began"),
                                  self.rt.cfg.train.out) from e
        else:  # a thread per worker beside 16: each may wait there (`ray_wire.RemoteSignal`)
            handle = self.cluster.spawn(ray_wire._Host, factory, *args,
                                        concurrency=16 + self.rt.num_workers,
                                        resource=self.rt.cfg.ray.ps_resource)
            self.cluster.watch(handle, f"the Ray actor of {cls.__name__}")
        ray_backend._ray().get(handle.notify_on.remote(tuple(proxy.get("mutating", ()))))
        self.hosted.append((cls, handle))
        self.dense_on_actor = self.dense_on_actor or dense_grads
        return ray_wire.Hosted(handle, cls, **proxy)

    def dense_ps(self, params, opt_state):
        """In this process (the roles' calls are the driver's own: an actor would add a hop
        each way), or with the roles in the actors an actor of its own that they call."""
        cfg = self.rt.cfg
        shards = cfg.ray.dense_shards
        if shards > 1 and not self.in_actors:
            raise ValueError(f"--ray.dense_shards {shards} shards the dense PS across actors "
                             "that the workers' actors call: it needs the roles in the actors "
                             "(--ray.roles actors or auto, with --algo async)")
        if not self.in_actors:
            return ps_lib.DensePS(params, opt_state, self.rt.dense_apply)
        import jax

        params, opt_state = jax.device_get((params, opt_state))
        if shards == 1:
            return self.host(ps_lib.DensePS, ray_dense.dense_ps, params, opt_state, cfg.dense)
        self._refuse_clipping(shards, "PS")
        params, pdef, cut = self._blocks(params, shards)
        servers = [self.host(ps_lib.DensePS, ray_dense.dense_ps, pick(params, pdef, b),
                             pick(opt_state, pdef, b), cfg.dense) for b in cut]
        return ray_dense.DenseShards(servers, cut, params, opt_state)

    def host_blocks(self, cls, factory, params, *args, near_roles=False):
        """`host`, or with ``--ray.dense_shards D`` D servers ``factory(block, *args)``, each
        of a block of whole leaves of `params`, behind one `ray_dense.SyncShards`."""
        shards = self.rt.cfg.ray.dense_shards
        if shards == 1:
            return self.host(cls, factory, params, *args, near_roles=near_roles)
        self._need_actors(shards, f"cuts {cls.__name__} into actors")
        params, pdef, cut = self._blocks(params, shards)
        servers = [self.host(cls, factory, pick(params, pdef, b), *args) for b in cut]
        return ray_dense.SyncShards(servers, cut, params)

    def host_group_blocks(self, cls, factory, dense, *args, joins=None):
        """`host` (near the roles), or with ``--ray.dense_shards D`` D servers ``factory(*block,
        *args)``, `block` each tree of `dense` cut to a block of whole leaves, behind one
        `ray_dense.GroupBlocks` (`parties` joins them through ``ray_wire.BlockGroup``)."""
        shards = self.rt.cfg.ray.dense_shards
        if shards == 1:
            return self.host(cls, factory, *dense, *args, near_roles=True)
        self._need_actors(shards, f"cuts {cls.__name__} into actors")
        self._refuse_clipping(shards, "server")
        dense = jax.device_get(dense)
        params, pdef, cut = self._blocks(dense[0], shards)
        servers = [self.host(cls, factory, *(pick(t, pdef, b) for t in dense), *args)
                   for b in cut]
        return ray_dense.GroupBlocks(servers, cut, params, joins or {})

    def _blocks(self, params, shards):
        """``(params on the host, their structure, the leaves of each of `shards` blocks)``:
        this interval cuts a dense server (`dense_blocks.blocks`)."""
        import jax

        params = jax.device_get(params)
        self.cut = True
        return params, jax.tree.structure(params), dense_blocks.blocks(params, shards)

    def _refuse_clipping(self, shards, what):
        """A block's `what` applies its part of a gradient; global-norm clipping needs all."""
        if self.rt.cfg.dense.clip_norm > 0:
            raise ValueError(f"--ray.dense_shards {shards}: each block's {what} applies its own "
                             "part of a gradient, and dense.clip_norm clips by the norm of the "
                             "whole gradient; drop one of them")

    def _need_actors(self, shards, what):
        if not self.in_actors:
            raise ValueError(f"--ray.dense_shards {shards} {what} that the workers' actors "
                             "call: it needs the roles in the actors (--ray.roles actors or "
                             "auto)")

    def run_role(self, fn, worker, *args, lost=None):
        if self.in_actors:
            return ray_role_driver.remote_role(fn, worker, *args, lost=lost)
        return fn(self.rt, worker, *args)

    def worker(self, wid, supply, group=None, group_size=1, compute=True):
        """A `ray_workers.RayWorker` whose compute runs in group `group`'s actor (default: a
        process of its own; a group of `group_size` workers gets as many XLA threads), or
        with the roles in the actors the driver's `ray_role_driver.ActorWorker` of it;
        without `compute`, with the roles here, the in-process `worker.Worker` (no
        process of its own: the PS is reached through the shards' proxies)."""
        group = wid if group is None else group
        if self.in_actors:
            return ray_role_driver.ActorWorker(self.rt, wid, supply, group, group_size)
        if not compute:
            return Worker(self.rt, wid, supply)
        return ray_workers.RayWorker(self.rt, wid, supply, group, group_size)

    def beside(self, group, factory, *args, group_size=1, name=None):
        """With the roles in the actors, ``factory(*args)`` made in group `group`'s actor,
        behind a `ray_role_worker.GroupLocal` proxy (its roles get the object itself); else
        the object, here."""
        if not self.in_actors:
            return factory(*args)
        key = f"{name or getattr(factory, '__name__', 'object')}-{group}"
        handle = self.groups.get(group, group_size)
        ray_backend._ray().get(handle.make_local.remote(key, factory, *args))
        return ray_role_worker.GroupLocal(handle, key, factory)

    def rendezvous(self, count, n, reduce, like=None):
        """With the roles in the actors, the groups hosted in an actor of their own
        (`ray_wire.Collectives`, reused by the next interval as `host`'s servers are), each
        joined through a `ray_wire.RemoteGroup`; with ``--ray.dense_shards D`` in D actors,
        each reducing one block of the parameters (`ray_wire.BlockGroup`); else in this
        process."""
        shards = self.rt.cfg.ray.dense_shards
        if shards > 1:
            self._need_actors(shards, "cuts the all-reduce into actors")
        if not self.in_actors:  # (the same groups, in this process)
            return ray_wire.Collectives(count, n, reduce, like).groups
        if shards == 1:
            hosted = self.host(ray_wire.Collectives, ray_wire.Collectives, count, n, reduce,
                               like)
            return [ray_wire.RemoteGroup(hosted._handle, k, n) for k in range(count)]
        like, pdef, cut = self._blocks(like, shards)
        hosts = [self.host(ray_wire.Collectives, ray_wire.Collectives, count, n, reduce,
                           pick(like, pdef, b)) for b in cut]
        return [ray_wire.BlockGroup([h._handle for h in hosts], k, n, cut, pdef)
                for k in range(count)]

    def companion(self, group, counters, group_size=1, worker=None):
        """A role without batches beside group `group`'s workers (ShadowSync's shadow,
        Persia's embedding backward role): with the roles in the actors, the driver's side
        of it run in that group's actor (`ray_role_driver.ActorWorker`, its counters
        `counters`)."""
        if not self.in_actors:
            return companion_here(counters, worker)
        return ray_role_driver.ActorWorker(self.rt, f"companion-{group}", None, group,
                                           group_size, counters)

    def remote_fn(self, group, name, factory, *args):
        key = (group, name, args)  # built once in the group's process, for every interval
        if key not in self._fns:
            self._fns[key] = ray_workers.RemoteFn(self.groups, group, name, factory, args)
        return self._fns[key]

    def role_fn(self, group, name, factory, *args):
        """In group `group`'s actor where the roles run there (handed to the role, the
        function itself: `ray_workers.RemoteFn`), else jitted here, where the role runs."""
        if self.in_actors:
            return self.remote_fn(group, name, factory, *args)
        key = (None, name, args)
        if key not in self._fns:
            self._fns[key] = LocalFn(jax.jit(factory(self.rt, *args)))
        return self._fns[key]

    def parties(self, server, count, n):
        """`server`'s own groups, or (hosted: `host`) joined in its actor through
        `ray_wire.RemoteGroup`, or (cut: `host_group_blocks`) in every block's at once."""
        if isinstance(server, ray_wire.Hosted):
            return [ray_wire.RemoteGroup(server._handle, k, n) for k in range(count)]
        if isinstance(server, ray_dense.GroupBlocks):
            return [ray_wire.BlockGroup([h._handle for h in server.servers], k, n, server.cut,
                                        server.pdef) for k in range(count)]
        return server.groups

    def warm(self, params, batch, shares=True):
        """Compile the groups' functions and (roles in the actors) open their data.

        Raises:
          ValueError: ``--ray.dense_shards`` > 1 where the run made no dense server to cut
            (the registry refuses the algorithms without one; ShadowSync's ``--sync none``
            is found here)."""
        shards = self.rt.cfg.ray.dense_shards
        if shards > 1 and not self.cut:
            raise ValueError(f"--ray.dense_shards {shards}: this run has no dense server to "
                             "cut into blocks (ShadowSync with --sync none syncs nothing); "
                             "drop --ray.dense_shards")
        # (a group keeps the shares of its workers: one worker's, a ShadowSync trainer's m)
        keep, w, members = ray_role_driver.keep, self.rt.num_workers, self.groups.members
        # (a group whose roles take no batches opens none: Persia's NN workers)
        opening = [h.prepare.remote(*keep(shares, members[g], w))
                   for g, h in self.groups.handles.items() if g in members
                   ] if self.in_actors else []
        self.groups.warm_all(params, batch)
        ray_backend._ray().get(opening)

    def check(self, now=False):
        self.cluster.check(now)

    def diagnose(self, e):
        """`e`, or the death of a vital process that caused it (a role's call to an actor of a
        dead raylet fails in Ray's own words first)."""
        if isinstance(e, (StateLost, KeyboardInterrupt)):
            return e
        try:
            self.cluster.check(now=True)
        except OSError as lost:
            return lost
        return e

    def parts(self) -> list:
        """A checkpoint's parts: each shard actor writes its own tables or LRU stores
        (``ray_parts.py``); none (the tables gathered into the state) when a shard is gone for
        good (its last snapshot is what is saved of it)."""
        try:
            return ray_parts.parts(self.rt.ps.shards)
        except ray_ps.PsFailed:
            return []

    def loader(self, ps):
        """The shards read their own tables of the step resumed (``ray_parts.ShardLoader``)."""
        return ray_parts.ShardLoader(ps.shards)

    def table_shapes(self, ps):
        """Asked of the shard actors (``ray_parts.shapes``): no store comes here."""
        return ray_parts.shapes(ps.shards)

    def fault_counters(self):
        return {**self.rt.ps.fault_counters(), "ray_worker_groups": len(self.groups.handles),
                "ray_worker_respawns": self.groups.respawns}

    def end_interval(self):
        """The interval's shared servers are done: their actors wait, still watched, for the
        next interval's servers (`host` builds them there)."""
        self.cut = False
        for cls, handle in self.hosted:
            self.spare.setdefault(cls, []).append(handle)
        self.hosted = []

    def close(self):
        self.cluster.stop()
