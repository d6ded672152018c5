"""The driver's side of the roles run in their Ray worker actors (``--ray.roles actors``;
the actors' side is ``ray_roles.py``, whose docstring tells the whole).

`in_actors` says whether a run's roles run there; `ActorWorker` is the driver's view of one
such role (its counters, filled in per chunk); `remote_role` is the driver's role that starts
it and lets it run chunk by chunk.
"""

from __future__ import annotations

import contextlib
import time

from algorithms.runtime.clock import Work, WorkerLost
from algorithms.runtime.ray_backend import _ray, parse_kill, sigkill
from algorithms.runtime.watchdog import RoleStalledError


def in_actors(cfg) -> bool:
    """Whether this ``--backend ray`` run's worker roles run in their actors
    (`recjax.registry.roles_in_actors`), which read the training data there: not for an
    in-memory source, which only this process holds (``auto`` keeps the roles here).

    Raises:
      ValueError: ``--ray.roles actors`` with in-memory training data.
    """
    from recjax.data.arrays import in_memory
    from recjax.registry import roles_in_actors

    if not roles_in_actors(cfg):
        return False
    if in_memory(cfg.data.train):
        if cfg.ray.roles == "actors":
            raise ValueError(f"--ray.roles actors: each worker actor reads its own shard of the "
                             f"training data, and {cfg.data.train} is an in-memory source of "
                             "this process only; use --ray.roles driver (or auto), or save the "
                             "arrays to a file and train on the file")
        return False
    return True


def keep(shares: bool, members, workers: int) -> tuple:
    """The share of the training data a worker group's actor keeps for its roles
    (`RoleServer.prepare`) where its supply `shares` the data out, each worker its own
    examples (`supply.StaticShards`): its workers' `members`' of `workers` (one worker's, or
    a ShadowSync trainer's m workers', `recjax.data.shard_cache.ShardCache`); all of it
    (``(0, 1)``) for GBA's list, which may hand any worker any entry."""
    members = tuple(sorted(members))
    if not shares or not members:
        return 0, 1
    return (members[0] if len(members) == 1 else members), workers


class ActorWorker:
    """The driver's side of a role run in its worker group's actor (`RoleServer`): the
    counters the report and the summary read (`worker.Worker`'s), filled in per chunk.

    Args:
      rt: the run's `engine.Runtime`.
      wid: the worker (an int), or for a role without batches (`supply` None: ShadowSync's
        shadow) the role's name in its actor.
      supply: the run's batch supply (the actor reads this worker's batches of it).
      group: the worker group whose actor runs the role; `group_size` workers share it.
      counters: the role's counters (default: a worker's, new).
    """

    def __init__(self, rt, wid, supply, group: int, group_size: int = 1, counters=None):
        from algorithms.runtime.supply import counted
        from algorithms.runtime.worker import Counters

        self.rt, self.wid, self.supply, self.group = rt, wid, supply, group
        self.group_size = group_size
        self.counters = counters or Counters(shard_bytes=[0] * rt.ps.num_shards)
        self.handle = rt.placement.groups.get(group, group_size)
        if supply is not None:  # the group's actor keeps the data of its workers
            rt.placement.groups.members.setdefault(group, set()).add(wid)
        self._reader = counted(rt.data, f"worker {wid}") if supply is not None else None
        self._kill_at = parse_kill(rt.cfg.ray.kill).get(("worker", wid), 0)
        self.died = False  # its process died (not: its role raised)
        self.idle = False  # the last chunk made no step: the role waited on a Wait (Collective)

    def start(self, fn, args: tuple) -> None:
        rt, sup = self.rt, self.supply
        shards = [(sh.handle if sh.names else None, list(sh.names), sh.generation)
                  for sh in rt.ps.shards]
        dims = {t.name: t.embedding_dim for t in rt.model.layout.tables}
        members = rt.placement.groups.members.get(self.group, ())
        share = keep(sup is not None and sup.shares, members, rt.num_workers)
        self._call("start_role", fn, self.wid, rt.num_workers, share,
                   sup.actor_spec() if sup is not None else None, shards, dims,
                   rt.dense_bytes, *args)

    def _call(self, method: str, *args):
        ray = _ray()
        try:
            return ray.get(getattr(self.handle, method).remote(*args))
        except ray.exceptions.RayActorError as e:
            self.died = True
            raise WorkerLost(f"worker {self.wid} (group {self.group}) died: {e}") from e

    def advance(self) -> bool:
        """One chunk; True when the role has ended (its share trained)."""
        ps, chunk_s = self.rt.ps, self.rt.cfg.ray.chunk_s
        out = self._call("advance", self.wid, self._allowance(), chunk_s)
        while out["down"] is not None:  # restart the shard; the role redoes its request
            self._take(out)
            ps.shards[out["down"]].revive()
            self._call("set_handles", [(sh.handle, sh.generation) if sh.names else None
                                       for sh in ps.shards])
            out = self._call("advance", self.wid, self._allowance(), chunk_s)
        self._take(out)
        if out["error"] is not None:
            raise out["error"]
        # a chunk spent waiting on a Wait or a Collective, without a step (a batch, a sync)
        self.idle = out["parked"] and not (out["metrics"] or out["iterations"] or out["syncs"])
        return out["done"]

    def _allowance(self) -> int:
        """Batches the next chunk may take: the chunks end where ``ray.kill`` injects a fault
        (this worker's process before its I-th iteration; a shard's before its I-th push),
        and the fault is injected there."""
        n = 1 << 30
        if self._kill_at:
            n = self._kill_at - 1 - self.counters.iterations
            if n <= 0:
                self._kill_at, n = 0, 1  # the chunk's call finds the process dead
                sigkill(self.handle, self.rt.placement.groups.pids[self.group])
        for sh in self.rt.ps.shards:
            left = sh.pushes_before_kill() if sh.names else None
            if left is not None:
                n = min(n, left)
        return n

    def _take(self, out: dict) -> None:
        c, ps = self.counters, self.rt.ps
        c.metrics += out["metrics"]
        c.indices += out["indices"]
        c.iterations += out["iterations"]
        c.syncs += out["syncs"]
        c.sync_bytes += out["sync_bytes"]
        if self._reader is not None:  # a worker's
            for s, b in enumerate(out["shard_bytes"]):
                c.shard_bytes[s] += b
            self._reader.rows += out["rows_read"]
        for s, k in enumerate(out["pushes"]):
            ps.shards[s].pushed_by_actors(k)  # a snapshot, if one is due
        links = {link.name: link for link in (*self.rt.shard_links, self.rt.dense_link)}
        for name, nbytes in out["link_bytes"].items():
            if name in links:
                links[name].bytes += nbytes

    def stop(self) -> None:
        """End the role in the actor (Ctrl-C, a failed role): it stops at its next batch."""
        ray = _ray()
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):  # dead or stuck: the
            ray.get(self.handle.stop_role.remote(self.wid), timeout=30)  # run's stop kills it


def remote_role(fn, worker: ActorWorker, *args, lost=None):
    """The driver's role for a role run in `worker`'s actor: start ``fn(rt, worker, *args)``
    there, then one chunk per yield (a zero `Work`: the driver's interpreter, report and
    watchdog see a step of progress per chunk) until it ends. If the actor's process dies,
    ``lost(wid)`` says so to the servers the role shared (GBA's PS0 stops waiting for it), as
    the role itself does when its worker's process dies under it in a driver thread."""
    limit, since = worker.rt.cfg.runtime.watchdog_s, None
    worker.start(fn, args)
    try:
        while not worker.advance():
            # A role parked on a Wait counts as stalled (watchdog.py); each chunk's yield is a
            # heartbeat there, so the chunks spent waiting are counted here.
            since = (since or time.monotonic()) if worker.idle else None
            if since is not None and limit and time.monotonic() - since > limit:
                raise RoleStalledError(
                    f"role of worker {worker.wid} waited on a Wait in its Ray actor for "
                    f"{time.monotonic() - since:.1f} s (runtime.watchdog_s={limit:g}): waiting "
                    "that long on another role is a hang of that one (a lost process, a "
                    "lock); the run stopped (with --out: checkpointed), or raise "
                    "--runtime.watchdog_s if that role is only slow")
            yield Work()
    except WorkerLost:
        if lost is not None and worker.died:
            lost(worker.wid)
        raise
    finally:
        worker.stop()
