"""Worker roles that run inside their Ray worker actors (``--ray.roles actors``; issue 38).

Under ``--ray.roles driver`` a worker's role (``clock.py``'s generator) runs in a driver thread
and every step is one call from there: the driver takes the batch, localizes it, pulls the
dense params and applies the dense gradient, so its CPU grows with the steps of every worker.
Here the same role function (the algorithm's own, e.g. `async_ps.worker_role`, unchanged) runs
in the worker's actor, with that actor's versions of what the role touches:

* the worker (`_ActorWorker`): its batches from its own shard of the data, read in the actor
  (`supply.StaticShards` for this worker only); its rows pulled from and pushed to the shard
  actors directly; its gradient computed there; a straggler's modelled slowdown slept there;
* the servers the role shares with the other workers (the dense PS): hosted actors
  (`placement.host`), called by the role through their `ray_wire.Hosted` proxy.

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

import collections
import contextlib
import threading
import time
import types

from algorithms.runtime import stragglers as stragglers_lib
from algorithms.runtime.clock import Link, Work, WorkerLost
from algorithms.runtime.ps import shard_bytes
from algorithms.runtime.ray_backend import _ray, parse_kill, sigkill
from algorithms.runtime.ray_wire import pack_rows, unpack_rows, wire_rows
from algorithms.runtime.ray_workers import ComputeServer


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
    at its next take after the chunk's steps or seconds, has ended, or a shard is down."""

    def __init__(self):
        self.cond = threading.Condition()
        self.allowed = self.taken = 0  # batches the chunks allowed so far, and taken
        self.deadline = 0.0
        self.waiting = self.done = self.stopped = False
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
            self.cond.wait_for(lambda: self.done or self.down is not None or (
                self.waiting and (self.taken >= self.allowed
                                  or time.monotonic() >= self.deadline)))

    def end(self, error: BaseException | None = None) -> None:
        with self.cond:
            self.done, self.error = True, error
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class _Delta:
    """A chunk's counters, taken by `RoleServer.advance` (the role's thread adds to them)."""

    def __init__(self, shards: int):
        self.lock = threading.Lock()
        self.shards = shards
        self.reset()

    def reset(self) -> dict:
        out = getattr(self, "d", None)
        self.d = {"metrics": [], "indices": [], "measured": [], "iterations": 0, "rows_read": 0,
                  "shard_bytes": [0] * self.shards, "pushes": [0] * self.shards,
                  "link_bytes": collections.Counter()}
        return out


class _ActorWorker:
    """`worker.Worker`'s interface in a worker actor (see the module docstring).

    Args:
      server: the actor (`RoleServer`): its jitted gradient and its gate.
      wid: the worker.
      supply: this worker's batches (`supply.StaticShards`).
      shards: per PS shard ``(actor handle, table names, its restarts)`` (no handle: a shard
        without tables).
      draws: the run's straggler draws (`stragglers.parse`).
      example_cost: modelled seconds per example (the `clock.Work` a role yields).
    """

    def __init__(self, server: RoleServer, wid: int, supply, shards: list, draws,
                 example_cost: float, dims: dict):
        self.server, self.wid, self.supply, self.draws = server, wid, supply, draws
        self.handles = [h for h, _, _ in shards]
        self.names = [names for _, names, _ in shards]
        self.gen = [0] * len(shards)  # handles received (the role's view)
        self.restarts = [r for _, _, r in shards]  # the driver's restart count of each shard
        self.example_cost, self.dims = example_cost, dims
        self.placement = {k: s for s, names in enumerate(self.names) for k in names}
        self.links = [Link(f"emb-ps-{s}", float("inf")) for s in range(len(shards))]
        self._read = 0

    # -- the role's interface ----------------------------------------------------------------
    def take(self):
        item = self.supply.take(self.wid) if self.server.gate.enter() else None
        reader = self.supply.data.readers.get(f"worker {self.wid}")
        if reader is not None:
            with self.server.delta.lock:
                self.server.delta.d["rows_read"] += reader.rows - self._read
            self._read = reader.rows
        return item

    def compute(self, params, item: tuple, it: int, coalesce: bool = False):
        if coalesce:
            raise NotImplementedError("roles in actors: a coalesced push (GBA's) is not ported")
        _, (local, rows) = item
        parts = {s: {k: rows[k] for k in names} for s, names in enumerate(self.names) if names}
        wires = {s: wire_rows(p) for s, p in parts.items()}
        pulled = self._each(lambda s: ("pull_rows", wires[s], True), parts)
        minis = [unpack_rows(pulled[s], parts[s]) for s in sorted(parts)]
        (m, secs), g, *per = self.server.compute(params, local, True, *minis)  # row sums
        nbytes = shard_bytes(rows, self.placement, self.dims, len(self.names))
        with self.server.delta.lock:
            d = self.server.delta.d
            d["metrics"].append(m)
            d["indices"].append(item[0])
            d["measured"].append(secs)
            for s, b in enumerate(nbytes):
                d["shard_bytes"][s] += b
        sums = {s: pack_rows(per[s], parts[s]) for s in parts}
        work = Work(self.example_cost * self.server.batch_size, self.draws.factor(self.wid, it),
                    tuple((self.links[s], b) for s, b in enumerate(nbytes) if b), measured=secs)
        return g, (wires, sums), work

    def push(self, pending) -> None:
        wires, sums = pending
        self._each(lambda s: ("push_rows", wires[s], sums[s]), wires)
        with self.server.delta.lock:
            d = self.server.delta.d
            for s in wires:
                d["pushes"][s] += 1
            d["iterations"] += 1

    # -- the shards --------------------------------------------------------------------------
    def _each(self, request, shards) -> dict:
        """``{shard: result}`` of ``request(shard) = (method, *args)`` sent to every shard at
        once; a shard whose actor died is reported to the driver (`_Gate.down`), which
        restarts it and hands the new handle (`RoleServer.set_handles`); then it is asked
        again."""
        ray = _ray()
        sent = {s: (self.gen[s], self._send(s, request)) for s in shards}
        out = {}
        for s, (gen, ref) in sent.items():
            while True:
                try:
                    out[s] = ray.get(ref)
                    break
                except ray.exceptions.RayActorError:
                    if not self.server.await_restart(s, gen):
                        raise WorkerLost(f"stopped while PS shard {s} was down") from None
                    gen, ref = self.gen[s], self._send(s, request)
        return out

    def _send(self, s: int, request):
        method, *args = request(s)
        return getattr(self.handles[s], method).remote(*args)


class RoleServer(ComputeServer):
    """A worker group's actor (`ray_workers.ComputeServer`) that also runs a worker's role.

    `start_role` builds the role with this actor's worker and starts it on a thread of its
    own, waiting at its first batch; `advance` runs one chunk; `stop_role` ends it where it
    waits. Only one role per actor (one worker per group: async PS).
    """

    def __init__(self, cfg, spec, batch_size: int, shard_names: list[list[str]]):
        super().__init__(cfg, spec, batch_size, shard_names)
        self.cfg, self.batch_size = cfg, batch_size
        self._feed = self._feed_share = None
        self.gate = _Gate()
        self.delta = _Delta(len(shard_names))
        self.worker: _ActorWorker | None = None
        self._thread: threading.Thread | None = None
        self._supply = None

    def start_role(self, fn, wid: int, workers: int, skip: int, quota: int, shards: list,
                   dims: dict, dense_bytes: int, *args) -> None:
        """Start ``fn(rt, worker, *args)`` (the algorithm's role function) for worker `wid`
        of `workers`, on the batches ``skip ..`` of its shard, ``quota`` batches among all
        workers (`supply.StaticShards`)."""
        from algorithms.runtime.ps import localize
        from algorithms.runtime.supply import StaticShards

        self.stop_role()
        self.prepare(wid, workers)
        f, tc, layout = self._feed, self.cfg.train, self.layout
        self._supply = StaticShards(f.data, self.batch_size, tc.seed, f.shuffle, workers, skip,
                                    quota, lambda b: localize(layout, b), f.depth)
        draws = stragglers_lib.parse(self.cfg.runtime.stragglers, workers, tc.seed)
        self.gate, self.delta = _Gate(), _Delta(len(shards))
        self.worker = _ActorWorker(self, wid, self._supply, shards, draws,
                                   self.cfg.runtime.example_cost_us * 1e-6, dims)
        rt = types.SimpleNamespace(dense_bytes=dense_bytes,
                                   dense_link=Link("sync-ps", float("inf")))
        role = fn(rt, self.worker, *args)
        self._thread = threading.Thread(target=self._drive, args=(role,),
                                        name=f"recjax-role-w{wid}", daemon=True)
        self._thread.start()

    def prepare(self, wid: int, workers: int) -> None:
        """Open the data in this process for worker `wid` of `workers` (synthetic data
        generated and its share kept: `supply.Feed`), once for the run: the placement calls it
        before the clock runs, as the driver opens its own data while the run sets up."""
        from algorithms.runtime.supply import Feed

        if self._feed is None or self._feed_share != (wid, workers):
            self._feed, self._feed_share = None, (wid, workers)
            self._feed = Feed(self.cfg, self.batch_size, share=(wid, workers))

    def _drive(self, role) -> None:
        """`clock._drive` in real time, for Work only: a straggler's slowdown slept here, the
        links' bytes counted (not held: see the module docstring)."""
        gate, value, error = self.gate, None, None
        try:
            while not gate.stopped:
                t0 = time.perf_counter()
                try:
                    effect = role.send(value)
                except StopIteration:
                    break
                if not isinstance(effect, Work):
                    raise TypeError(f"a role in an actor yielded {effect!r}; only Work is "
                                    "supported there")
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
        return {**out, "done": gate.done, "down": gate.down, "error": gate.error}

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

    def start(self, fn, args: tuple) -> None:
        rt, sup = self.rt, self.supply
        shards = [(sh.handle if sh.names else None, list(sh.names), sh.generation)
                  for sh in rt.ps.shards]
        dims = {t.name: t.embedding_dim for t in rt.model.layout.tables}
        self._call("start_role", fn, self.wid, sup.num_workers, sup.skip, sup.quota, shards,
                   dims, rt.dense_bytes, *args)

    def _call(self, method: str, *args):
        ray = _ray()
        try:
            return ray.get(getattr(self.handle, method).remote(*args))
        except ray.exceptions.RayActorError as e:
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


def remote_role(fn, worker: ActorWorker, *args):
    """The driver's role for a role run in `worker`'s actor: start ``fn(rt, worker, *args)``
    there, then one chunk per yield (a zero `Work`: the driver's interpreter, report and
    watchdog see a step of progress per chunk) until it ends."""
    worker.start(fn, args)
    try:
        while not worker.advance():
            yield Work()
    finally:
        worker.stop()
