"""The worker a role run in its Ray worker actor sees (``--ray.roles actors``, ``ray_roles.py``).

`RoleWorker` is `worker.Worker`'s interface in the actor: batches from the worker's own supply
read there (``supply.py``: its `StaticShards`, or GBA's list by entry index), rows pulled from
and pushed to the PS shard actors directly, gradients computed in the actor
(`ray_workers.ComputeServer`), and the chunk's counters (`Delta`) that the driver takes per
chunk (`ray_roles.RoleServer.advance`).

`GroupLocal` is an object the roles of one actor share (a ShadowSync trainer's replica, shared
by its Hogwild workers and its shadow): it lives in that actor (`LOCALS`), and the driver reads
and sets it through the proxy (an eval, a checkpoint, a resume, between chunks).
"""

from __future__ import annotations

import collections
import functools
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.runtime.clock import Link, Work, WorkerLost
from algorithms.runtime.ps import shard_bytes
from algorithms.runtime.ray_backend import _ray
from algorithms.runtime.ray_wire import Parcel, pack_rows, state_lost, unpack_rows, wire_rows

LOCALS: dict[str, object] = {}  # this actor's objects its roles share (`GroupLocal`)


def _here(key: str):
    """A `GroupLocal` arriving in an actor: the object itself, if it lives in this one."""
    if key not in LOCALS:
        raise RuntimeError(f"{key} lives in another worker group's actor than the role it "
                           "was handed to; a role may share the objects of its own group only")
    return LOCALS[key]


class GroupLocal:
    """A proxy of an object living in a worker group's actor beside its roles (see the
    module docstring): handed to a role in that actor it is the object itself; read here, each
    attribute is a call to the actor (a method's call, too), and set here, likewise. The
    actor's death loses the object, which is the run's state: `segments.StateLost`."""

    def __init__(self, handle, key: str, cls: type):
        self.__dict__.update(_handle=handle, _key=key, _cls=cls)

    def __reduce__(self):
        return _here, (self._key,)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle: not the object's
            raise AttributeError(name)
        if callable(getattr(self._cls, name, None)):  # a method: called there
            return lambda *args: self._call(name, args)
        with self._lost():
            return _ray().get(self._handle.local_attr.remote(self._key, name))

    def _call(self, name: str, args: tuple):
        with self._lost():
            return _ray().get(self._handle.local_call.remote(self._key, name, *args))

    def __setattr__(self, name: str, value) -> None:
        with self._lost():
            _ray().get(self._handle.local_set.remote(self._key, name, value))

    def _lost(self):
        return state_lost(f"{self._key} ({self._cls.__name__})")


class Delta:
    """A chunk's counters, taken by `RoleServer.advance` (the role's thread adds to them)."""

    def __init__(self, shards: int):
        self.lock = threading.Lock()
        self.shards = shards
        self.reset()

    def reset(self) -> dict:
        out = getattr(self, "d", None)
        self.d = {"metrics": [], "indices": [], "measured": [], "rows_read": 0,
                  "shard_bytes": [0] * self.shards, "pushes": [0] * self.shards,
                  "link_bytes": collections.Counter()}
        return out


def counters() -> types.SimpleNamespace:
    """A role's counters in its actor (the role or its worker counts; `RoleServer.advance`
    hands the driver what they grew by): iterations, a ShadowSync syncer's syncs and bytes,
    and the metrics and indices of the steps a role records itself (Persia's NN workers; a
    worker's `compute` records its own in the chunk's `Delta`)."""
    return types.SimpleNamespace(iterations=0, syncs=0, sync_bytes=0, metrics=[], indices=[])


class RoleWorker:
    """`worker.Worker`'s interface in a worker actor (see the module docstring).

    Args:
      server: the actor (`RoleServer`): its jitted gradient.
      slot: the role's place in the actor (`ray_roles._Slot`): its gate and chunk counters.
      wid: the worker.
      supply: this worker's batches (`supply.StaticShards`, or GBA's `supply.EntryReader`).
      shards: per PS shard ``(actor handle, table names, its restarts)`` (no handle: a shard
        without tables).
      draws: the run's straggler draws (`stragglers.parse`).
      example_cost: modelled seconds per example (the `clock.Work` a role yields).
    """

    def __init__(self, server, slot, wid: int, supply, shards: list, draws,
                 example_cost: float, dims: dict):
        self.server, self.slot, self.wid, self.supply, self.draws = server, slot, wid, supply, draws
        self.handles = [h for h, _, _ in shards]
        self.names = [names for _, names, _ in shards]
        self.gen = [0] * len(shards)  # handles received (the role's view)
        self.restarts = [r for _, _, r in shards]  # the driver's restart count of each shard
        self.example_cost, self.dims = example_cost, dims
        self.placement = {k: s for s, names in enumerate(self.names) for k in names}
        self.links = [Link(f"emb-ps-{s}", float("inf")) for s in range(len(shards))]
        self._read = 0
        self._warm = True  # the role thread's first gradient computation is not timed
        self.counters = counters()

    # -- the role's interface ----------------------------------------------------------------
    def take(self):
        item = self.supply.take(self.wid) if self.slot.gate.enter() else None
        reader = self.supply.data.readers.get(f"worker {self.wid}")
        if reader is not None:
            with self.slot.delta.lock:
                self.slot.delta.d["rows_read"] += reader.rows - self._read
            self._read = reader.rows
        return item

    def compute(self, params, item: tuple, it: int, coalesce: bool = False):
        """Pull the batch's rows from the shards, compute; the pending push is the rows'
        sums per shard, or with `coalesce` (GBA, whose PS0 aggregates them) ``(rows, sums)``
        for the role to hand on: every table's padded rows and its real rows' sums
        (`pack_rows`, as a worker group's actor hands them on under driver roles)."""
        _, (local, rows) = item
        parts = {s: {k: rows[k] for k in names} for s, names in enumerate(self.names) if names}
        wires = {s: wire_rows(p) for s, p in parts.items()}
        pulled = self._each(lambda s: ("pull_rows", wires[s], True), parts)
        minis = [unpack_rows(pulled[s], parts[s]) for s in sorted(parts)]
        if self._warm:  # its first execution on this thread took 83-118 ms in 2 runs of 5
            self._warm = False  # (later ones 2-3 ms), which a straggler's sleep multiplies
            self.server.compute(params, local, True, *minis)
        (m, secs), g, *per = self.server.compute(params, local, True, *minis)  # row sums
        nbytes = shard_bytes(rows, self.placement, self.dims, len(self.names))
        with self.slot.delta.lock:
            d = self.slot.delta.d
            d["metrics"].append(m)
            d["indices"].append(item[0])
            for s, b in enumerate(nbytes):
                d["shard_bytes"][s] += b
        sums = {s: pack_rows(per[s], parts[s]) for s in parts}
        work = Work(self.example_cost * self.server.batch_size, self.draws.factor(self.wid, it),
                    tuple((self.links[s], b) for s, b in enumerate(nbytes) if b), measured=secs)
        if coalesce:
            return g, (rows, {k: v for part in sums.values() for k, v in part.items()}), work
        return g, (wires, sums), work

    def push(self, pending) -> None:
        wires, sums = pending
        self._each(lambda s: ("push_rows", wires[s], sums[s]), wires)
        with self.slot.delta.lock:
            d = self.slot.delta.d
            for s in wires:
                d["pushes"][s] += 1
        self.counters.iterations += 1

    # -- messages to another role (Persia's activations and their gradients) ----------------
    @staticmethod
    def send(message) -> Parcel:
        """`message` put in the object store once: the server that holds it until its
        receiver takes it (Persia's pipeline) holds a reference only, and the bytes go from
        this process to the receiver's, not through the server's."""
        return Parcel(_ray().put(message))

    @staticmethod
    def receive(message):
        return _ray().get(message.ref) if isinstance(message, Parcel) else message

    # -- the embedding PS, reached by the role itself (Persia's embedding workers) ----------
    def pull(self, rows) -> dict:
        """`ps.EmbeddingPS.pull`: the mini tables of `rows`, from the shards' actors."""
        parts = self._parts(rows)
        pulled = self._each(lambda s: ("pull_rows", wire_rows(parts[s]), True), parts)
        out = {}
        for s in sorted(parts):
            out.update(unpack_rows(pulled[s], parts[s]))
        return out

    def push_rows(self, rows, grads: dict) -> None:
        """`ps.EmbeddingPS.push` of ``grads[name] = (local ids, row grads)``: summed per row
        here, and only the real rows' sums sent (`pack_rows`, as a worker's `push`): the
        same update as the entries (the sparse optimizer sums a row's entries first), to
        rounding, in about a fifth of the bytes (dlrm_kaggle: 22% of a batch's rows real)."""
        parts = self._parts(rows)
        sums = {k: np.asarray(_row_sums(*grads[k], rows[k][0].size)) for k in rows}
        self._each(lambda s: ("push_rows", wire_rows(parts[s]),
                              pack_rows({k: sums[k] for k in parts[s]}, parts[s])), parts)
        with self.slot.delta.lock:  # (the driver's snapshots of the shards count them)
            for s in parts:
                self.slot.delta.d["pushes"][s] += 1

    def shard_bytes(self, rows) -> list[int]:
        return shard_bytes(rows, self.placement, self.dims, len(self.names))

    def _parts(self, rows) -> dict:
        return {s: {k: rows[k] for k in names} for s, names in enumerate(self.names) if names}

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
                    if not self.server.await_restart(self.slot, s, gen):
                        raise WorkerLost(f"stopped while PS shard {s} was down") from None
                    gen, ref = self.gen[s], self._send(s, request)
        return out

    def _send(self, s: int, request):
        method, *args = request(s)
        return getattr(self.handles[s], method).remote(*args)


@functools.partial(jax.jit, static_argnums=2)
def _row_sums(ids, grads, rows: int):
    """``f32[rows, D]``: each row's entries of `grads` added up (ids past `rows` dropped)."""
    return jnp.zeros((rows, grads.shape[-1]), grads.dtype).at[ids].add(grads, mode="drop")

