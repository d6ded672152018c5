"""Worker roles that run inside their Ray worker actors (``--ray.roles actors``; issue 38).

Under ``--ray.roles driver`` a worker's role (``clock.py``'s generator) runs in a driver thread
and every step is one call from there: the driver takes the batch, localizes it, pulls the
dense params and applies the dense gradient, so its CPU grows with the steps of every worker.
Here the same role function (the algorithm's own: `async_ps.worker_role`, `gba.worker_role`,
unchanged) runs in the worker's actor, with that actor's versions of what the role touches:

* the worker (`ray_role_worker.RoleWorker`): its batches read in the actor (async:
  `supply.StaticShards` for this worker only; GBA: the entries of the data list that PS0's
  `supply.EntryIndex` hands it, `supply.EntryReader`); its rows pulled from and pushed to the
  shard actors directly; its gradient computed there; a straggler's modelled slowdown slept
  there;
* the servers the role shares with the other workers (the dense PS, GBA's PS0 and its list):
  hosted actors (`placement.host`), called by the role through their `ray_wire.Hosted`
  proxy; a `Wait` on such a server's signal (GBA's gate of the mode) waits in the server's
  actor (`ray_wire.RemoteSignal`), and a chunk may end while the role waits there.

The driver's part is `remote_role`: it starts the role in the actor and then lets it run in
chunks of ``ray.chunk_s`` seconds (`RoleServer.advance`), each ending where the role asks for its
next batch, i.e. after its previous step's pushes landed, so the state is whole between chunks:
an eval, a checkpoint or a stop waits for at most one chunk. Per chunk the driver takes the
chunk's counters (the batches' metrics, the bytes each shard served, the pushes each shard
took) into the driver-side `ActorWorker`, which the report and the summary read as they read a
threaded worker's. The driver's work is per chunk, not per step.

Failures, as under ``driver`` roles: a worker actor that dies ends its role (`clock.WorkerLost`);
a PS shard that dies under a pull or push is restarted by the driver's `ray_ps.ShardProxy`
(the actor reports it and waits for the new handle, then redoes that request); a dead hosted
server stops the run (`segments.StateLost`). ``ray.kill`` injects them at chunk boundaries: a
worker is killed before the chunk that would begin its I-th iteration (chunks are cut there); a
shard once the pushes it took reach I.

Not modelled here: ``runtime.emulate_links`` (a single host's model of a shared network link
would need a central lock on every transfer, which is the serial part this mode removes); the
links' byte counts are kept. The roles run in real time (no ``--deterministic``).
"""

from __future__ import annotations

import contextlib
import threading
import time
import types

from algorithms.runtime import stragglers as stragglers_lib
from algorithms.runtime.clock import Link, Wait, Work, WorkerLost
from algorithms.runtime.ray_backend import _ray, parse_kill, sigkill
from algorithms.runtime.ray_role_worker import Delta, RoleWorker
from algorithms.runtime.ray_workers import ComputeServer
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


class _Gate:
    """Between the role's thread in the actor and the driver's `RoleServer.advance`: the role
    may take a batch while the chunk allows it (`enter`); `advance` returns when the role waits
    at its next take after the chunk's steps or seconds, or is parked on a `Wait` (GBA's gate:
    its previous step's push has landed, so the state is whole there too) after them, has
    ended, or a shard is down."""

    def __init__(self):
        self.cond = threading.Condition()
        self.allowed = self.taken = 0  # batches the chunks allowed so far, and taken
        self.deadline = 0.0
        self.waiting = self.parked = self.done = False
        self.stop_event = threading.Event()  # also read by a wait elsewhere (a `Wait`'s)
        self.down: int | None = None  # a shard whose actor died under a request
        self.error: BaseException | None = None

    def enter(self) -> bool:
        """The role asks for its next batch: wait for a chunk that allows it; False: stop."""
        with self.cond:
            self.waiting = True
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.stopped or (
                self.taken < self.allowed and time.monotonic() < self.deadline))
            self.waiting = False
            if self.stopped:
                return False
            self.taken += 1
            return True

    def chunk(self, n: int, seconds: float) -> None:
        """Allow `n` more batches, for `seconds`, and wait for the chunk's end."""
        with self.cond:
            self.allowed, self.deadline = self.taken + n, time.monotonic() + seconds
            self.cond.notify_all()
            while not (self.done or self.down is not None or (
                    (self.waiting or self.parked) and (self.taken >= self.allowed
                                                       or time.monotonic() >= self.deadline))):
                # parked, nothing wakes it at the deadline
                self.cond.wait(max(self.deadline - time.monotonic(), 0) + 1e-3
                               if self.parked else None)

    def park(self, parked: bool) -> None:
        """The role waits on a `Wait` (True), or no longer (False)."""
        with self.cond:
            self.parked = parked
            self.cond.notify_all()

    def end(self, error: BaseException | None = None) -> None:
        with self.cond:
            self.done, self.error = True, error
            self.cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self.stop_event.is_set()

    def stop(self) -> None:
        with self.cond:
            self.stop_event.set()
            self.cond.notify_all()


class RoleServer(ComputeServer):
    """A worker group's actor (`ray_workers.ComputeServer`) that also runs a worker's role.

    `start_role` builds the role with this actor's worker and starts it on a thread of its
    own, waiting at its first batch; `advance` runs one chunk; `stop_role` ends it where it
    waits. Only one role per actor (one worker per group: async PS, GBA).
    """

    def __init__(self, cfg, spec, batch_size: int, shard_names: list[list[str]]):
        super().__init__(cfg, spec, batch_size, shard_names)
        self.cfg, self.batch_size = cfg, batch_size
        self._feed = self._feed_share = None
        self.gate = _Gate()
        self.delta = Delta(len(shard_names))
        self.worker: RoleWorker | None = None
        self._reported = 0  # the worker's iterations handed to the driver
        self._thread: threading.Thread | None = None
        self._supply = None

    def start_role(self, fn, wid: int, workers: int, supply: tuple, shards: list, dims: dict,
                   dense_bytes: int, *args) -> None:
        """Start ``fn(rt, worker, *args)`` (the algorithm's role function) for worker `wid`
        of `workers`, on the batches of its `supply` (the driver's supply's `actor_spec`):
        ``("shards", workers, skip, quota)``, the batches ``skip ..`` of its shard, ``quota``
        among all workers (`supply.StaticShards`); or ``("list", index, m)``, GBA's list
        (`supply.EntryReader`), the entries' indices from `index`."""
        from algorithms.runtime.ps import localize
        from algorithms.runtime.supply import StaticShards

        self.stop_role()
        kind, *spec = supply
        shares = kind == "shards"
        self.prepare(wid, workers, shares)
        f, tc, layout = self._feed, self.cfg.train, self.layout
        if shares:
            skip, quota = spec[1:]
            self._supply = StaticShards(f.data, self.batch_size, tc.seed, f.shuffle, workers,
                                        skip, quota, lambda b: localize(layout, b), f.depth)
        else:
            self._supply = f.entries(*spec, lambda b: localize(layout, b))
        draws = stragglers_lib.parse(self.cfg.runtime.stragglers, workers, tc.seed)
        self.gate, self.delta, self._reported = _Gate(), Delta(len(shards)), 0
        self.worker = RoleWorker(self, wid, self._supply, shards, draws,
                                 self.cfg.runtime.example_cost_us * 1e-6, dims)
        rt = types.SimpleNamespace(dense_bytes=dense_bytes,
                                   dense_link=Link("sync-ps", float("inf")))
        role = fn(rt, self.worker, *args)
        self._thread = threading.Thread(target=self._drive, args=(role,),
                                        name=f"recjax-role-w{wid}", daemon=True)
        self._thread.start()

    def prepare(self, wid: int, workers: int, shares: bool = True) -> None:
        """Open the data in this process for worker `wid` of `workers` (synthetic data
        generated and, when the workers' supply `shares` the data out, its share kept:
        `supply.Feed`; GBA's list may hand any worker any entry), once for the run: the
        placement calls it before the clock runs, as the driver opens its own data while the
        run sets up."""
        from algorithms.runtime.supply import Feed

        share = (wid, workers) if shares else (0, 1)
        if self._feed is None or self._feed_share != share:
            self._feed, self._feed_share = None, share
            self._feed = Feed(self.cfg, self.batch_size, share=share)

    def _drive(self, role) -> None:
        """`clock._drive` in real time, for Work and Wait: a straggler's slowdown slept here,
        the links' bytes counted (not held: see the module docstring); a Wait on a hosted
        server's signal waits in that server's actor (`ray_wire.RemoteSignal`)."""
        gate, value, error = self.gate, None, None
        try:
            while not gate.stopped:
                t0 = time.perf_counter()
                try:
                    effect = role.send(value)
                except StopIteration:
                    break
                if isinstance(effect, Wait):
                    gate.park(True)
                    try:
                        if not effect.signal.wait_for(effect.condition, gate.stop_event):
                            break
                    finally:
                        gate.park(False)
                    continue
                if not isinstance(effect, Work):
                    raise TypeError(f"a role in an actor yielded {effect!r}; only Work and "
                                    "Wait are supported there")
                took = time.perf_counter() - t0 if effect.measured is None else effect.measured
                with self.delta.lock:
                    for link, nbytes in effect.transfers:
                        self.delta.d["link_bytes"][link.name] += nbytes
                idle = max((effect.factor - 1.0) * took, 0.0) + effect.pause
                with gate.cond:  # the slowdown, then the pause; a stop cuts it short
                    gate.cond.wait_for(lambda: gate.stopped, timeout=idle)
        except BaseException as e:  # noqa: BLE001 - handed to the driver by `advance`
            error = e
        finally:
            role.close()
            if self._supply is not None:
                self._supply.close()
            gate.end(error)

    def advance(self, n: int, seconds: float) -> dict:
        """Let the role take up to `n` batches for `seconds`; the chunk's counters, and
        ``done`` (the role ended: its share is trained), ``down`` (a shard whose actor died:
        restart it and `set_handles`), ``error`` (the role's exception)."""
        gate = self.gate
        gate.chunk(n, seconds)
        with self.delta.lock:
            out = self.delta.reset()
        done = self.worker.counters.iterations  # (counted by the worker, or by its role)
        out["iterations"], self._reported = done - self._reported, done
        return {**out, "done": gate.done, "down": gate.down, "error": gate.error,
                "parked": gate.parked}

    def await_restart(self, shard: int, gen: int) -> bool:
        """The role's thread: shard `shard` died; wait for the driver's new handle (True) or
        a stop (False)."""
        gate = self.gate
        with gate.cond:
            if self.worker.gen[shard] == gen:
                gate.down = shard
                gate.cond.notify_all()
                gate.cond.wait_for(lambda: gate.stopped or self.worker.gen[shard] != gen)
            return not gate.stopped

    def set_handles(self, handles: list) -> None:
        """The shards' actors as they are now: ``(handle, restarts)`` per shard (None: no
        tables); a shard restarted since the role last heard gets its new handle."""
        gate = self.gate
        with gate.cond:
            for s, h in enumerate(handles):
                if h is not None and h[1] != self.worker.restarts[s]:
                    self.worker.handles[s], self.worker.restarts[s] = h
                    self.worker.gen[s] += 1
            gate.down = None
            gate.cond.notify_all()

    def stop_role(self) -> None:
        """End the role where it waits (its next batch) and join its thread."""
        if self._thread is not None:
            self.gate.stop()
            self._thread.join()
            self._thread = None


class ActorWorker:
    """The driver's side of a worker whose role runs in its actor (`RoleServer`): the counters
    the report and the summary read (`worker.Worker`'s), filled in per chunk."""

    def __init__(self, rt, wid: int, supply, group: int):
        from algorithms.runtime.supply import counted
        from algorithms.runtime.worker import Counters

        self.rt, self.wid, self.supply, self.group = rt, wid, supply, group
        self.counters = Counters(shard_bytes=[0] * rt.ps.num_shards)
        self.handle = rt.placement.groups.get(group, 1)
        self._reader = counted(rt.data, f"worker {wid}")
        self._kill_at = parse_kill(rt.cfg.ray.kill).get(("worker", wid), 0)
        self.died = False  # its process died (not: its role raised)
        self.idle = False  # the last chunk took no batch: the role waited on a Wait

    def start(self, fn, args: tuple) -> None:
        rt, sup = self.rt, self.supply
        shards = [(sh.handle if sh.names else None, list(sh.names), sh.generation)
                  for sh in rt.ps.shards]
        dims = {t.name: t.embedding_dim for t in rt.model.layout.tables}
        self._call("start_role", fn, self.wid, rt.num_workers, sup.actor_spec(), shards, dims,
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
        out = self._call("advance", self._allowance(), chunk_s)
        while out["down"] is not None:  # restart the shard; the role redoes its request
            self._take(out)
            ps.shards[out["down"]].revive()
            self._call("set_handles", [(sh.handle, sh.generation) if sh.names else None
                                       for sh in ps.shards])
            out = self._call("advance", self._allowance(), chunk_s)
        self._take(out)
        if out["error"] is not None:
            raise out["error"]
        self.idle = out["parked"] and not out["metrics"]  # a chunk spent waiting on a Wait
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
            ray.get(self.handle.stop_role.remote(), timeout=30)           # run's stop kills it


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
