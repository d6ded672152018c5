"""Deferred worker computations, batched on the virtual clock (issue 35, "a fast virtual clock").

On the virtual clock a worker's gradient is not needed when the role reads the params: only
when its result is first used, by its push after its `clock.Work` has run in virtual time.
So while `run_virtual` runs (`batching`), `worker.Worker.compute` does not call its jitted
function: it `submit`\\ s the call's inputs (the params object it read, the rows it pulled, its
batch: values, which nothing mutates) and gets a `Deferred`. The first `resolve` of any of them
runs *every* call pending at that moment in one jitted call (`Batcher.force`), so a step of W
workers costs one dispatch instead of W. The events and the versions read are the eager
calls': only how the compute is executed changes.

The batched program is a loop over the stacked calls (`lax.fori_loop` to the number pending,
so one program of `lanes` slots serves any count) whose body is the plain function: each call
is computed as a plain call computes it, bit for bit (a `vmap` is as fast but rounds the dense
gradients differently on XLA:CPU: its batched dot reduces in another order). So a run's numbers
do not change, and the threads and Ray, which never batch, compute what they did.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_ACTIVE: list[Batcher] = []  # the batcher of the virtual clock now running (one thread only)
ENABLED = True  # False: computations run when made on the virtual clock too (bench_clock --eager)


class Deferred:
    """The result of one submitted call, computed at the first `get`. Attributes:
      key: what it is batched by (the jitted function and the lanes of its batched program).
      args: the call's inputs.
      on_done: called with the result once it is computed (a worker's metrics record).
    """

    __slots__ = ("batcher", "key", "args", "value", "on_done")

    def __init__(self, batcher: Batcher, key: tuple, args: tuple, on_done: Callable | None):
        self.batcher, self.key, self.args, self.on_done = batcher, key, args, on_done
        self.value: Any = None

    @property
    def done(self) -> bool:
        return self.args is None

    def get(self) -> Any:
        if not self.done:
            self.batcher.force(self.key)
        return self.value

    def part(self, index: int) -> Part:
        """A handle on element `index` of the result tuple."""
        return Part(self, index)

    def _set(self, value: Any) -> None:
        self.value, self.args = value, None
        if self.on_done is not None:
            self.on_done(value)


class Part:
    """Element `index` of a `Deferred`'s result (its dense gradient, its row gradients)."""

    __slots__ = ("deferred", "index")

    def __init__(self, deferred: Deferred, index: int):
        self.deferred, self.index = deferred, index

    def get(self) -> Any:
        return self.deferred.get()[self.index]


def resolve(x: Any) -> Any:
    """`x` itself, or the value of a `Deferred` / `Part` (computing its batch if need be)."""
    return x.get() if isinstance(x, (Deferred, Part)) else x


# fn (a runtime's jitted function) -> its batched program; an entry goes with its function
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Batcher:
    """The pending calls of one virtual-clock run and the batched programs that run them."""

    def __init__(self):
        self.pending: dict[tuple, list[Deferred]] = {}
        self.calls = 0  # batched calls made (benchmarks)
        self.lanes_used = 0  # lanes of those holding a real call

    def submit(self, fn: Callable, lanes: int, args: tuple,
               on_done: Callable | None = None) -> Deferred:
        """Defer ``fn(*args)`` (`fn` jitted, with ``fn.__wrapped__`` the plain function) to a
        batched program of `lanes` lanes."""
        key = (fn, lanes)
        d = Deferred(self, key, args, on_done)
        self.pending.setdefault(key, []).append(d)
        return d

    def program(self, key: tuple) -> Callable:
        """``(n, *stacked args) -> stacked results``: ``fn`` on slots ``0..n-1`` of `lanes`
        stacked calls, one after the other in one jitted loop (compiled once per `fn` and
        shapes: every checkpoint interval of a run, each a virtual-clock run of its own, uses
        the runtime's one `fn`, so its program is compiled once for the whole run)."""
        fn, _ = key
        if fn not in _PROGRAMS:
            _PROGRAMS[fn] = jax.jit(functools.partial(_loop, fn.__wrapped__))
        return _PROGRAMS[fn]

    def force(self, key: tuple) -> None:
        """Run every call pending under `key`, `lanes` at a time in the order submitted."""
        todo = self.pending.pop(key, [])
        lanes = key[1]
        for start in range(0, len(todo), lanes):
            chunk = todo[start:start + lanes]
            out = self.program(key)(np.int32(len(chunk)), *_stacked([d.args for d in chunk], lanes))
            outs, tree = jax.tree.flatten(jax.device_get(out))  # one transfer; lanes are views
            self.calls += 1
            self.lanes_used += len(chunk)
            for lane, d in enumerate(chunk):
                d._set(jax.tree.unflatten(tree, [x[lane] for x in outs]))

    def flush(self) -> None:
        """Run every pending call (the run ended: in-flight batches' metrics are read)."""
        for key in list(self.pending):
            self.force(key)


def _stacked(calls: list[tuple], lanes: int) -> list:
    """Each argument of `calls` stacked over `lanes` lanes (idle lanes: copies of the first
    call). An object several calls share (the params version they read) is flattened once."""
    calls = calls + [calls[0]] * (lanes - len(calls))
    out = []
    for j in range(len(calls[0])):
        objs = [c[j] for c in calls]
        leaves: dict[int, list] = {}
        for o in objs:
            if id(o) not in leaves:
                flat, tree = jax.tree.flatten(o)
                leaves[id(o)] = [np.asarray(x) for x in flat]
        if len(leaves) == 1:  # every lane reads the same object
            stacked = [np.repeat(x[None], lanes, 0) for x in leaves[id(objs[0])]]
        else:
            per = [leaves[id(o)] for o in objs]
            stacked = [np.stack([p[i] for p in per]) for i in range(len(per[0]))]
        out.append(jax.tree.unflatten(tree, stacked))
    return out


def _loop(fn: Callable, n, *stacked):
    """``fn`` on slot i of each of `stacked` for i < n, into slot i of its stacked results."""
    first = jax.tree.map(lambda x: x[0], stacked)
    lanes = jax.tree.leaves(stacked)[0].shape[0]
    out = jax.tree.map(lambda s: jnp.zeros((lanes, *s.shape), s.dtype), jax.eval_shape(fn, *first))

    def body(i, acc):
        got = fn(*jax.tree.map(lambda x: x[i], stacked))
        return jax.tree.map(lambda a, g: a.at[i].set(g), acc, got)

    return jax.lax.fori_loop(0, n, body, out)


def active() -> Batcher | None:
    """The batcher of the virtual clock now running, or None (threads, Ray, outside a run)."""
    return _ACTIVE[-1] if _ACTIVE and ENABLED else None


@contextlib.contextmanager
def batching() -> Iterator[Batcher]:
    """While inside, `Worker.compute` defers to the batcher; at the exit every pending call
    runs (`run_virtual` holds one for its run)."""
    b = Batcher()
    _ACTIVE.append(b)
    try:
        yield b
    finally:
        _ACTIVE.remove(b)
        b.flush()


__all__ = ["Batcher", "Deferred", "Part", "active", "batching", "resolve"]
