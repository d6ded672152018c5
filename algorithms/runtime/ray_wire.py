"""What travels between the driver and the Ray actors (``--backend ray``; docs/distributed.md).

* references nested in arguments: `ShardGrads` (a worker's row gradients, one reference per PS
  shard), `resolve` (fetch every reference inside an argument but a `Parcel`'s), `host_value`
  (what a call sends: references as they are, jax arrays as numpy);
* rows as they travel between a worker actor and a shard actor: `wire_rows` (the real ids
  only), `pack_rows` (the real rows only) and their inverses;
* hosted servers: `Hosted`, the driver's proxy of a value-only server (``ps.DensePS``,
  ``ps.SyncPS``, GBA's PS0) built in an actor of its own (`_Host`);
* hosted all-reduce groups: `collectives.Collectives` (``clock.Rendezvous`` groups, or a
  server with their calls, in an actor of their own) and `RemoteGroup`, the group a role run
  in its worker actor joins (ShadowSync's MA and BMUF among the trainers' actors, Persia's NN
  workers' all-reduce).

The cluster and its watch are ``ray_backend.py``; the PS shards ``ray_ps.py``; the worker
groups ``ray_workers.py``; where each lives, ``ray_placement.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import time
from typing import Any

import jax
import numpy as np

from algorithms.runtime import ps as ps_lib
from algorithms.runtime.clock import CLOSED
from algorithms.runtime.collectives import Collectives  # noqa: F401 (hosted by name)
from algorithms.runtime.dense_blocks import join as join_blocks
from algorithms.runtime.dense_blocks import pick
from algorithms.runtime.ray_backend import _ray
from algorithms.runtime.segments import StateLost


# -- references nested in arguments -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ShardGrads:
    """A worker's row gradients as one object reference per PS shard (``None``: no tables)."""

    refs: tuple


class Parcel:
    """An object reference that travels as it is: `resolve` does not fetch it (a message one
    role sends another through a server that only holds it, `RoleWorker.send`)."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


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
    """The actor body of `host`: an object built by `factory`, called by method name.

    A call of one of its `mutating` methods (`notify_on`) wakes `wait_until`: a role in another
    actor waits here, not by asking again and again (`RemoteSignal`)."""

    def __init__(self, factory, *args):
        self.cond = threading.Condition()
        self.mutating: frozenset = frozenset()
        self.obj = factory(*args)

    def rebuild(self, factory, *args) -> None:
        """Replace the object (the next checkpoint interval's server, in the same process)."""
        self.obj = None
        self.obj = factory(*args)
        self._wake()

    def notify_on(self, names) -> None:
        """The methods after whose calls `wait_until`'s conditions are checked again."""
        self.mutating = frozenset(names)

    def call(self, method: str, *args) -> Any:
        """The method's result, its jax arrays as numpy: Ray pickles a jax array through
        ``ArrayImpl.__reduce__``, on the 2-core box 6.5-7.5 ms of CPU to return dlrm_kaggle's
        2 MB of dense params (GBA's PS0's) against 3.8-4.0 ms as numpy
        (docs/performance.md)."""
        out = jax.device_get(getattr(self.obj, method)(*resolve(args)))
        if method in self.mutating:
            self._wake()
        return out

    def wait_until(self, method: str, args: tuple, timeout: float) -> bool:
        """Whether ``obj.method(*args)`` holds, waiting up to `timeout` seconds for a mutating
        call to make it hold (a `clock.Wait` of a role in another actor, `RemoteSignal`). The
        condition is checked under the host's lock, which every mutating call takes after its
        write, so a write that makes it true cannot be missed (`clock.Signal.wait_for`)."""
        end = time.monotonic() + timeout
        with self.cond:
            while not getattr(self.obj, method)(*args):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def attr(self, name: str) -> Any:
        return getattr(self.obj, name)

    def pid(self) -> int:
        return os.getpid()


class RemoteSignal:
    """A hosted server's `clock.Signal` as a role in another actor (``ray_roles.py``) holds
    it: `wait_for` a condition that is one of the server's methods, bound to its arguments
    (``functools.partial(server.may_start, wid)``), waits in the server's actor
    (`_Host.wait_until`), woken by the server's own writes: one call per wait (of at most
    ``poll_s``, then the role's `stop` is looked at), not one per check. `notify` is the
    host's: it notifies after every mutating call, whoever made it."""

    poll_s = 0.2

    def __init__(self, handle, server: str):
        self.handle, self.server = handle, server
        self.generation = 0  # (read by the virtual clock only, which never runs in an actor)

    def notify(self) -> None:
        pass

    def wait_for(self, condition, stop: threading.Event) -> bool:
        """Block until ``condition()`` (True) or `stop` is set (False).

        Raises:
          TypeError: a condition that is not a method of this server bound to arguments.
        """
        func = getattr(condition, "func", None)
        if not (isinstance(condition, functools.partial) and isinstance(func, _Method)
                and not condition.keywords
                and func.proxy._handle._actor_id == self.handle._actor_id):
            raise TypeError(f"a role in a Ray actor waits on {self.server}'s signal for "
                            f"{condition!r}: such a Wait's condition must be one of "
                            f"{self.server}'s methods bound to its arguments "
                            "(functools.partial(server.method, *args)), which its actor checks")
        ray = _ray()
        while not stop.is_set():
            if ray.get(self.handle.wait_until.remote(func.name, condition.args, self.poll_s)):
                return True
        return False


@contextlib.contextmanager
def state_lost(what: str):
    """A call to an actor that holds run state which is not restarted (a hosted server, a
    group's shared object): that actor's death as `StateLost`, naming `what` it held."""
    try:
        yield
    except _ray().exceptions.ActorDiedError as e:
        raise StateLost(f"the Ray actor of {what} died, and the run's state held there with it "
                        "(it is not restarted); the run stops without a new checkpoint") from e


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

    def __reduce__(self):
        """To another actor (a role run there, `ray_roles`): the same calls, without the
        attributes kept in this process; its signal there is a `RemoteSignal`, and results
        come as values (a reference only saves the driver a hop)."""
        local = ({"signal": RemoteSignal(self._handle, self._cls.__name__)}
                 if "signal" in self._local else None)
        return Hosted, (self._handle, self._cls, local)

    def __getattr__(self, name: str) -> Any:
        if name in self._local:
            return self._local[name]
        if not callable(getattr(self._cls, name, None)):
            with self._lost():
                return _ray().get(self._handle.attr.remote(name))
        return _Method(self, name)

    def _lost(self):
        return state_lost(self._cls.__name__)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._cls.__name__} lives in a Ray actor; set {name} through "
                             "one of its methods")


class _Method:
    """A method of a `Hosted` server: a blocking call to its actor (see `Hosted`)."""

    def __init__(self, proxy: Hosted, name: str):
        self.proxy, self.name = proxy, name

    def __call__(self, *args):
        h, name = self.proxy, self.name
        args = tuple(host_value(a) if not isinstance(a, ShardGrads) and not
                     dataclasses.is_dataclass(a) else a for a in args)
        if name in h._by_ref:
            out = tuple(h._handle.call.options(num_returns=h._by_ref[name]).remote(name, *args))
        else:
            with h._lost():
                out = _ray().get(h._handle.call.remote(name, *args))
        if name in h._mutating and "signal" in h._local:
            h._local["signal"].notify()
        return out

    def __repr__(self) -> str:
        return f"<{self.proxy._cls.__name__}.{self.name} in a Ray actor>"


# -- hosted all-reduce groups ------------------------------------------------------------------
def _joined(refs: list, stop: threading.Event, poll_s: float) -> list | None:
    """The ``(closed, result)`` of each `Collectives.join` call of `refs` once all are in,
    looking at the role's `stop` every `poll_s` s; None when it stops first."""
    ray = _ray()
    while not stop.is_set():
        if len(ray.wait(refs, num_returns=len(refs), timeout=poll_s)[0]) == len(refs):
            with state_lost("Collectives"):
                return ray.get(refs)
    return None


class RemoteGroup:
    """Group `k` of a hosted `Collectives`, as a role in a worker actor joins it (a
    ``clock.Collective``'s group: ``n``, ``join(index, value, stop)``, ``close()``) and as the
    driver closes it for a party whose actor died (``shadowsync``'s ``lost``). `join` sends the
    value once and waits for the result in ``poll_s`` slices, looking at the role's `stop`
    between them; a role that stops leaves its call waiting there until the group closes
    (its `close`, in the role's ``finally``)."""

    poll_s = 0.2

    def __init__(self, handle, k: int, n: int):
        self.handle, self.k, self.n = handle, k, n

    def join(self, index: int, value, stop: threading.Event):
        ref = self.handle.call.remote("join", self.k, index, jax.device_get(value))
        outs = _joined([ref], stop, self.poll_s)
        return CLOSED if outs is None or outs[0][0] else outs[0][1]

    def close(self) -> None:
        """Release the group's waiting parties (idempotent). Where the host died the group is
        gone with it (its death is the run's, `segments.StateLost`, seen by the watch): not
        raised here, inside a role's ``finally``."""
        ray = _ray()
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(self.handle.call.remote("close", self.k))


class BlockGroup:
    """Group `k` of several hosted `Collectives`, one per block of the parameters
    (``--ray.dense_shards``, `dense_blocks.blocks`): a party sends block b of its value to
    `handles` [b], all at once, and gets each block's reduction back, put together in its
    value's layout. No one actor serves the whole of every sync: the shape of a ring's
    reduce-scatter / all-gather, where each block is reduced in a place of its own. Exact for
    a reduction that acts leaf by leaf (MA / BMUF's mean): each leaf is reduced as in one
    group, over the same parties in the same order. A group closed in any block is closed."""

    poll_s = RemoteGroup.poll_s

    def __init__(self, handles: list, k: int, n: int, cut: list[list[int]], pdef):
        self.parts = [RemoteGroup(h, k, n) for h in handles]
        self.k, self.n, self.cut, self.pdef = k, n, cut, pdef
        # the results' layout (a value not shaped as the params, Persia's `FAILED`, goes whole
        # to every block)
        self._like = jax.tree.unflatten(pdef, [0] * pdef.num_leaves)

    def join(self, index: int, value, stop: threading.Event):
        value = jax.device_get(value)
        refs = [g.handle.call.remote("join", self.k, index, pick(value, self.pdef, b))
                for g, b in zip(self.parts, self.cut)]
        outs = _joined(refs, stop, self.poll_s)
        if outs is None or any(closed for closed, _ in outs):
            return CLOSED
        return join_blocks([out for _, out in outs], self._like, self.pdef)

    def close(self) -> None:
        for g in self.parts:
            g.close()
