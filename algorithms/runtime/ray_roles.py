"""Worker roles that run inside their Ray worker actors (``--ray.roles actors``; issue 38).

Under ``--ray.roles driver`` a worker's role (``clock.py``'s generator) runs in a driver thread
and every step is one call from there: the driver takes the batch, localizes it, pulls the
dense params and applies the dense gradient, so its CPU grows with the steps of every worker.
Here the same role function (the algorithm's own: `async_ps.worker_role`, `gba.worker_role`,
`shadowsync.worker_role` and `shadow_role`, Persia's `persia_roles.nn_worker`,
`embedding_forward` and `embedding_backward`) runs in the worker group's actor (one worker; a
ShadowSync trainer's m workers and its shadow; a Persia embedding worker's two roles: one
thread per role), with that actor's versions of what the role touches:

* the worker (`ray_role_worker.RoleWorker`): its batches read in the actor (async:
  `supply.StaticShards` for this worker only; GBA: the entries of the data list that PS0's
  `supply.EntryIndex` hands it, `supply.EntryReader`; Persia's embedding workers likewise from
  its pipeline); its rows pulled from and pushed to the shard actors directly; its gradient
  computed there (a `RemoteFn` handed to the role is the function there); a straggler's
  modelled slowdown slept there;
* the servers the role shares with the other workers (the dense PS, GBA's PS0 and its list,
  ShadowSync's EASGD sync PS, Persia's pipeline and dense group): hosted actors
  (`placement.host`), called by the role through their `ray_wire.Hosted` proxy; a `Wait` on
  such a server's signal (GBA's gate of the mode, Persia's pipeline) waits in the server's
  actor (`ray_wire.RemoteSignal`), and a chunk may end while the role waits there;
* what the roles of one group share (a ShadowSync trainer's replica, a Persia embedding
  worker's queue of looked-up batches): made in the group's actor
  (`RoleServer.make_local`, `placement.beside`), the object itself there.

The driver's part is `ray_role_driver.remote_role`: it starts the role in the actor and then
lets it run in chunks of ``ray.chunk_s`` seconds (`RoleServer.advance`), each ending where the
role asks for its next batch, i.e. after its previous step's pushes landed, so the state is
whole between chunks: an eval, a checkpoint or a stop waits for at most one chunk. Per chunk
the driver takes the chunk's counters (the batches' metrics, the bytes each shard served, the
pushes each shard took) into the driver-side `ActorWorker`, which the report and the summary
read as they read a threaded worker's. The driver's work is per chunk, not per step.

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

import threading
import time
import types

import jax
import numpy as np

from algorithms.runtime import stragglers as stragglers_lib
from algorithms.runtime.clock import CLOSED, Collective, Link, Wait, Work
from algorithms.runtime.ray_role_worker import LOCALS, Delta, RoleWorker
from algorithms.runtime.ray_role_worker import counters as role_counters
from algorithms.runtime.ray_workers import ComputeServer


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
        self.running = False  # a chunk is under way (the driver is in `chunk`)
        self.collecting = False  # parked in a Collective (else on a Wait)
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
            self.running = True
            self.cond.notify_all()
            while not (self.done or self.down is not None or self._between()):
                # parked, nothing wakes it at the deadline
                self.cond.wait(max(self.deadline - time.monotonic(), 0) + 1e-3
                               if self.parked else None)
            self.running = False

    def _between(self) -> bool:
        """Whether the role is where a chunk may end: at its next take (or parked on a
        `Wait`, which comes before it) once the chunk's batches are taken or its seconds
        spent; parked in a `Collective` (part of its last batch's iteration: FR's sync after
        it) only once its seconds are spent, so a chunk of n batches ends after the n-th
        iteration's sync unless the peers keep it waiting past the chunk."""
        late = time.monotonic() >= self.deadline
        used = self.taken >= self.allowed
        return ((self.waiting and (used or late))
                or (self.parked and (late or (used and not self.collecting))))

    def park(self, parked: bool, collective: bool = False) -> None:
        """The role waits on a `Wait` (or with `collective`, in a `Collective`): True; or no
        longer: False."""
        with self.cond:
            self.parked, self.collecting = parked, parked and collective
            self.cond.notify_all()

    def resume(self) -> bool:
        """Out of a park after which the role changes the state at once (a `Collective`'s
        result, which it applies to its replica): if the chunk ended while it was parked,
        wait for the next one, so that the state stays as the driver found it between
        chunks (an eval, a checkpoint). False: stop."""
        with self.cond:
            self.parked = self.collecting = False
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.stopped or self.running)
            return not self.stopped

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


class _Slot:
    """One role run in a worker actor: its gate, its chunk's counters, its worker (a
    `RoleWorker`, once started), its supply (None: a role without batches) and its thread."""

    def __init__(self, shards: int):
        self.gate, self.delta = _Gate(), Delta(shards)
        self.worker = types.SimpleNamespace(counters=role_counters())
        self.supply = self.thread = None
        self.reported = role_counters()  # the counters handed to the driver so far


class RoleServer(ComputeServer):
    """A worker group's actor (`ray_workers.ComputeServer`) that also runs its workers' roles.

    `start_role` builds a role with this actor's worker and starts it on a thread of its own,
    waiting at its first batch; `advance` runs one chunk of it; `stop_role` ends it where it
    waits. A role is a worker's (async PS and GBA: one per actor; ShadowSync: a trainer's m
    Hogwild workers), or a role without batches beside them (ShadowSync's shadow), which a
    chunk lets run yield by yield. The roles of one actor share its objects (`make_local`:
    a trainer's replica, `ray_role_worker.GroupLocal`).
    """

    def __init__(self, cfg, spec, batch_size: int, shard_names: list[list[str]]):
        super().__init__(cfg, spec, batch_size, shard_names)
        self.cfg, self.batch_size = cfg, batch_size
        self._feed = self._feed_share = None
        self.slots: dict = {}  # role key (a worker's id, or a name) -> `_Slot`
        self._apply = None  # the dense optimizer's jitted update (a role's `rt.dense_apply`)
        self._lock = threading.Lock()  # the roles of a group start at once: one data, one jit

    def start_role(self, fn, key, workers: int, share: tuple, supply: tuple | None,
                   shards: list, dims: dict, dense_bytes: int, *args) -> None:
        """Start ``fn(rt, worker, *args)`` (the algorithm's role function) as role `key`: the
        role of worker `key` of `workers`, keeping `share` ``(worker, workers)`` of the data
        in this process (``(0, 1)``: all of it), on the batches of its `supply` (the
        driver's supply's `actor_spec`): ``("shards", workers, skip, quota)``, the batches
        ``skip ..`` of its shard, ``quota`` among all workers (`supply.StaticShards`); or
        ``("list", index, m, local)``, GBA's list (`supply.EntryReader`), the entries' indices from
        `index`, with ``m`` entries per step, localized if ``local`` (Persia's embedding
        workers localize the ids they receive themselves). No `supply`: a role without
        batches (its `worker` reaches the PS, and never takes a batch)."""
        from algorithms.runtime.ps import localize
        from algorithms.runtime.supply import StaticShards

        self.stop_role(key)
        slot = self.slots[key] = _Slot(len(shards))
        # (a Collective's modelled seconds are not slept here: links are not emulated)
        rt = types.SimpleNamespace(dense_bytes=dense_bytes, dense_apply=self._dense_apply(),
                                   dense_link=Link("sync-ps", float("inf")),
                                   bandwidth=float("inf"))
        if supply is not None:
            kind, *spec = supply
            self.prepare(*share)
            f, tc, layout = self._feed, self.cfg.train, self.layout
            if kind == "shards":
                skip, quota = spec[1:]
                slot.supply = StaticShards(f.data, self.batch_size, tc.seed, f.shuffle,
                                           spec[0], skip, quota, lambda b: localize(layout, b),
                                           f.depth)
            else:  # (index, m, whether the entries come localized)
                index, m, local = spec
                slot.supply = f.entries(index, m, (lambda b: localize(layout, b)) if local
                                        else (lambda b: b))
        # (a role without batches may still reach the PS: Persia's embedding backward role)
        draws = stragglers_lib.parse(self.cfg.runtime.stragglers, workers, self.cfg.train.seed)
        slot.worker = RoleWorker(self, slot, key, slot.supply, shards, draws,
                                 self.cfg.runtime.example_cost_us * 1e-6, dims)
        role = fn(rt, slot.worker, *args)
        name = f"recjax-role-w{key}" if isinstance(key, int) else f"recjax-role-{key}"
        slot.thread = threading.Thread(target=self._drive, args=(role, slot, supply is None),
                                       name=name, daemon=True)
        slot.thread.start()

    def prepare(self, wid, workers: int) -> None:
        """Open the data in this process, keeping the share of worker `wid` (or of the tuple
        of workers `wid`: a ShadowSync trainer's) of `workers` (synthetic data generated and
        its share kept: `supply.Feed`; ``(0, 1)``: all of it, for GBA's list, which may hand
        any worker any entry), once for the run: the placement calls it before the clock
        runs, as the driver opens its own data while the run sets up
        (`ray_role_driver.keep`)."""
        from algorithms.runtime.supply import Feed

        share = (wid, workers)
        with self._lock:
            if self._feed is None or self._feed_share != share:
                self._feed, self._feed_share = None, share
                self._feed = Feed(self.cfg, self.batch_size, share=share)

    def kept_rows(self) -> int | None:
        """Training examples this process holds in memory (None: it reads them from their
        file as it goes, or has not opened them)."""
        train = self._feed.data.train if self._feed is not None else None
        return getattr(train, "kept_rows", None)

    def _dense_apply(self):
        """The dense optimizer's update, jitted here (`engine.Runtime.dense_apply`'s)."""
        from recjax.train.setup import make_dense_tx
        from recjax.train.step import apply_dense

        with self._lock:
            if self._apply is None:
                tx = make_dense_tx(self.cfg.dense)
                self._apply = jax.jit(lambda p, o, g: apply_dense(tx, p, o, g))
        return self._apply

    # -- the objects the roles of this actor share (`ray_role_worker.GroupLocal`) -------------
    def make_local(self, key: str, factory, *args) -> None:
        """``factory(*args)`` as this actor's object `key`; a dense replica's update is
        compiled now, before the clock runs."""
        obj = LOCALS[key] = factory(*args)
        if hasattr(obj, "apply") and hasattr(obj, "opt_state"):
            jax.block_until_ready(self._dense_apply()(
                obj.params, obj.opt_state, jax.tree.map(np.zeros_like, obj.params)))

    def local_attr(self, key: str, name: str):
        return jax.device_get(getattr(LOCALS[key], name))

    def local_call(self, key: str, name: str, *args):
        return jax.device_get(getattr(LOCALS[key], name)(*args))

    def local_set(self, key: str, name: str, value) -> None:
        setattr(LOCALS[key], name, value)

    # -- the roles -----------------------------------------------------------------------------
    def _drive(self, role, slot: _Slot, each_yield: bool) -> None:
        """`clock._drive` in real time: a straggler's slowdown slept here, the links' bytes
        counted (not held: see the module docstring); a Wait on a hosted server's signal
        waits in that server's actor (`ray_wire.RemoteSignal`); a Collective's group is
        hosted (`ray_wire.RemoteGroup`), and a chunk may end while the role waits there, as
        at a Wait (its step's pushes landed; it applies the result in a chunk). A role
        without batches (`each_yield`) passes the gate before each of its steps, as a worker's
        role does before each batch."""
        gate, value, error = slot.gate, None, None
        try:
            while not gate.stopped:
                if each_yield and not gate.enter():
                    break
                t0 = time.perf_counter()
                try:
                    effect = role.send(value)
                except StopIteration:
                    break
                value = None
                if isinstance(effect, Collective):
                    gate.park(True, collective=True)
                    try:
                        value = effect.group.join(effect.index, effect.value, gate.stop_event)
                    except BaseException:
                        gate.park(False)
                        raise
                    if value is CLOSED or not gate.resume():
                        break  # a party left (the role ends, as in a thread), or a stop
                    continue
                if isinstance(effect, Wait):
                    gate.park(True)
                    try:
                        if not effect.signal.wait_for(effect.condition, gate.stop_event):
                            break
                    finally:
                        gate.park(False)
                    continue
                if not isinstance(effect, Work):
                    raise TypeError(f"a role in an actor yielded {effect!r}; effects are Work, "
                                    "Collective, Wait")
                took = time.perf_counter() - t0 if effect.measured is None else effect.measured
                with slot.delta.lock:
                    if effect.measured is not None:  # every role's timed compute (m_W)
                        slot.delta.d["measured"].append(effect.measured)
                    for link, nbytes in effect.transfers:
                        slot.delta.d["link_bytes"][link.name] += nbytes
                idle = max((effect.factor - 1.0) * took, 0.0) + effect.pause
                with gate.cond:  # the slowdown, then the pause; a stop cuts it short
                    gate.cond.wait_for(lambda: gate.stopped, timeout=idle)
        except BaseException as e:  # noqa: BLE001 - handed to the driver by `advance`
            error = e
        finally:
            role.close()
            if slot.supply is not None:
                slot.supply.close()
            gate.end(error)

    def advance(self, key, n: int, seconds: float) -> dict:
        """Let role `key` take up to `n` batches (or steps) for `seconds`; the chunk's
        counters, and ``done`` (the role ended: its share is trained), ``down`` (a shard whose
        actor died: restart it and `set_handles`), ``error`` (the role's exception)."""
        slot = self.slots[key]
        gate = slot.gate
        gate.chunk(n, seconds)
        with slot.delta.lock:
            out = slot.delta.reset()
        now, was = slot.worker.counters, slot.reported
        for k in ("iterations", "syncs", "sync_bytes"):  # (counted by the worker or the role)
            out[k] = getattr(now, k) - getattr(was, k)
            setattr(was, k, getattr(now, k))
        for k in ("metrics", "indices"):  # a role's own records (Persia's NN workers')
            got = len(getattr(now, k))
            out[k] += getattr(now, k)[:got]
            del getattr(now, k)[:got]
        return {**out, "done": gate.done, "down": gate.down, "error": gate.error,
                "parked": gate.parked}

    def await_restart(self, slot: _Slot, shard: int, gen: int) -> bool:
        """A role's thread: shard `shard` died; wait for the driver's new handle (True) or
        a stop (False)."""
        gate = slot.gate
        with gate.cond:
            if slot.worker.gen[shard] == gen:
                gate.down = shard
                gate.cond.notify_all()
                gate.cond.wait_for(lambda: gate.stopped or slot.worker.gen[shard] != gen)
            return not gate.stopped

    def set_handles(self, handles: list) -> None:
        """The shards' actors as they are now: ``(handle, restarts)`` per shard (None: no
        tables); each role's worker that last heard of an older one gets the new handle."""
        for slot in self.slots.values():
            w = slot.worker
            if not isinstance(w, RoleWorker):
                continue
            with slot.gate.cond:
                for s, h in enumerate(handles):
                    if h is not None and h[1] != w.restarts[s]:
                        w.handles[s], w.restarts[s] = h
                        w.gen[s] += 1
                slot.gate.down = None
                slot.gate.cond.notify_all()

    def stop_role(self, key=None) -> None:
        """End role `key` (None: every role) where it waits and join its thread."""
        for k in list(self.slots) if key is None else [key]:
            slot = self.slots.get(k)
            if slot is not None and slot.thread is not None:
                slot.gate.stop()
                slot.thread.join()
                slot.thread = None
