"""The engine's effects and two interpreters of its roles: real threads, or a virtual clock.

A *role* (a worker, a shadow thread, a PS's apply loop) is a Python generator. It reads and
writes shared state (parameter servers, replicas) through their value-only interfaces, and
between those reads and writes it yields an *effect* that says what the step cost or what it
waits for. The effect set is open: an interpreter dispatches on the effect's type, and
every effect below is handled by both interpreters.

* `Work(seconds, factor, transfers, pause, measured)`: compute that took ``seconds`` of
  modelled time (``measured`` real seconds, where the role timed its compute), slowed down
  ``factor`` x by the straggler model, then ``transfers`` over shared `Link`\\ s (a PS link
  serves one transfer at a time), then an idle ``pause``;
* `Collective(group, index, value, seconds)`: join the all-reduce `group` as party ``index``;
  the generator receives the group's reduction of every party's value;
* `Wait(signal, condition)`: park until ``condition()`` is true. The condition is re-checked
  only when another role notifies `signal` after a write (e.g. a PS applied a global step), so
  a parked role costs nothing: no polling on the virtual clock, a condition-variable wait in
  threads. The generator receives True (False when the run is stopping).

`run_threaded` runs every role in its own thread (through `recjax.concurrency.ThreadGroup`):
compute is real, a straggler sleeps ``(factor - 1)`` x its measured compute time (``measured``:
a worker's gradient computation, timed by `worker.Worker` or in a Ray worker's actor, so its
pushes and pulls are not scaled; a role without it, the wall time since it last resumed), a link is
held for ``bytes / bandwidth`` (``emulate_links``), a collective is a barrier (then held for
its ``seconds``). `run_virtual` runs the same generators one event at a time in the calling
thread, ordered by virtual time, ties first-scheduled-first (so roles that finish a step at
the same instant all act, e.g. all push, before any of them acts again): the schedule, and
therefore every parameter, is a pure function of the seed. Reads happen when a role is resumed
and writes after its yield returns, so a role that yields a long `Work` really sees stale
state, as it would in the threaded run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import signal
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from algorithms.runtime import batched
from recjax.concurrency import ThreadGroup

CLOSED = object()  # what a collective returns when the group shut down


class WorkerLost(Exception):
    """Raised inside a role when the process doing its work died (Ray): the interpreter ends
    that role, counts it in `Schedule.lost`, the others go on (GBA's PS gates catch it first)."""


@dataclasses.dataclass
class Link:
    """A PS network link: serves one transfer at a time at ``bandwidth`` bytes/s.

    Attributes:
      name: for summaries.
      bandwidth: bytes per second (``inf`` = free).
      free_at: virtual time when the link is next idle.
      busy: total seconds it spent transferring (virtual or emulated).
      bytes: total bytes moved."""

    name: str
    bandwidth: float
    free_at: float = 0.0
    busy: float = 0.0
    bytes: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def seconds(self, nbytes: int) -> float:
        return nbytes / self.bandwidth

    def virtual(self, start: float, nbytes: int) -> float:
        """Queue a transfer arriving at virtual time `start`; returns its end time."""
        begin = max(start, self.free_at)
        self.free_at = begin + self.seconds(nbytes)
        self.busy += self.seconds(nbytes)
        self.bytes += nbytes
        return self.free_at

    def hold(self, nbytes: int, stop: threading.Event, emulate: bool) -> bool:
        """Threaded transfer: hold the link for ``bytes / bandwidth`` s; False if stopped."""
        with self._lock:
            self.bytes += nbytes
            if not emulate:
                return True
            s = self.seconds(nbytes)
            self.busy += s
            return not stop.wait(s)


@dataclasses.dataclass(frozen=True)
class Work:
    """Attributes:
      seconds: modelled compute time (virtual clock only; threads measure theirs).
      factor: straggler slowdown.
      transfers: ``(link, bytes)`` pairs, in order, after the compute.
      pause: idle time after the transfers (a shadow thread's interval).
      measured: the step's measured compute seconds (threads, Ray), what a straggler's
        `factor` multiplies; None: the role's wall time since it last resumed."""

    seconds: float = 0.0
    factor: float = 1.0
    transfers: tuple[tuple[Link, int], ...] = ()
    pause: float = 0.0
    measured: float | None = None


@dataclasses.dataclass(frozen=True)
class Collective:
    """Attributes:
      group: the `Rendezvous` to join.
      index: this party's index in [0, group.n).
      value: this party's contribution.
      seconds: modelled communication time of the collective for each party."""

    group: Rendezvous
    index: int
    value: Any
    seconds: float = 0.0


class Rendezvous:
    """A reusable n-party all-reduce: every party gets ``reduce([v_0, ..., v_{n-1}])``.

    The reduction sees the values in party order whatever the arrival order, so it is
    deterministic. `close` releases every waiting party with `CLOSED` (a party left for good)."""

    def __init__(self, n: int, reduce: Callable[[list], Any]):
        self.n, self.reduce = n, reduce
        self._cond = threading.Condition()
        self._values: dict[int, Any] = {}
        self._generation = 0
        self._result: Any = None
        self._closed = False

    def join(self, index: int, value: Any, stop: threading.Event) -> Any:
        with self._cond:
            if self._closed:
                return CLOSED
            gen = self._generation
            self._values[index] = value
            if len(self._values) == self.n:
                values, self._values = [self._values[k] for k in range(self.n)], {}
                self._result = self.reduce(values)
                self._generation += 1
                self._cond.notify_all()
                return self._result
            while self._generation == gen:
                if self._closed or stop.is_set():
                    return CLOSED
                self._cond.wait(0.05)
            return self._result

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Signal:
    """Notified by a role after a write that may make some `Wait` condition true.

    In threads it is a condition variable; on the virtual clock the interpreter compares
    ``generation`` before and after each event and re-checks only the roles parked on a signal
    that changed. Writers call `notify` *after* the write."""

    def __init__(self, name: str = "signal"):
        self.name = name
        self.generation = 0
        self._cond = threading.Condition()

    def notify(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait_for(self, condition: Callable[[], bool], stop: threading.Event) -> bool:
        """Block until ``condition()`` (True) or `stop` is set (False).

        The condition is checked under the signal's lock, so a notify after the write that makes
        it true cannot be missed; the timeout only bounds how late a stop is noticed.
        """
        with self._cond:
            while not condition():
                if stop.is_set():
                    return False
                self._cond.wait(0.05)
            return True


@dataclasses.dataclass(frozen=True)
class Wait:
    """Attributes:
      signal: the `Signal` whose writers can make the condition true.
      condition: ``() -> bool``, read-only (it may run in another role's thread or event)."""

    signal: Signal
    condition: Callable[[], bool]


Effect = Work | Collective | Wait
Role = Generator[Effect, Any, None]


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """Attributes:
      name: thread name / trace label.
      role: the generator.
      foreground: the run ends when every foreground role has ended; background roles
        (shadow threads) are then stopped."""

    name: str
    role: Role
    foreground: bool = True


@dataclasses.dataclass
class Schedule:
    """What an interpreter reports. Attributes:
      seconds: wall seconds (threaded) or virtual seconds (virtual) until the foreground ended.
      trace: role indices in the order their events ran (virtual mode only).
      lost: ``"role: reason"`` of each role that ended with `WorkerLost`."""

    seconds: float
    trace: list[int]
    lost: list[str] = dataclasses.field(default_factory=list)

    @property
    def events(self) -> int:
        """Times the virtual clock resumed a role (a parked `Wait` adds one, when it is
        released; a transfer's own events are not counted); 0 in threads."""
        return len(self.trace)


def _drive(role: Role, stop: threading.Event, emulate: bool, name: str = "",
           lost: list | None = None) -> None:
    """Thread body: run one role's effects for real until it ends or `stop` is set."""
    value = None
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                effect = role.send(value)
            except StopIteration:
                return
            except WorkerLost as e:
                if lost is not None:
                    lost.append(f"{name}: {e}")
                print(f"recjax: role {name} ended, its process died ({e}); the run goes on "
                      "without it", flush=True)
                return
            value = None
            if isinstance(effect, Work):
                took = time.perf_counter() - t0 if effect.measured is None else effect.measured
                extra = (effect.factor - 1.0) * took
                if extra > 0 and stop.wait(extra):
                    return
                for link, nbytes in effect.transfers:
                    if not link.hold(nbytes, stop, emulate):
                        return
                if effect.pause > 0 and stop.wait(effect.pause):
                    return
            elif isinstance(effect, Wait):
                if not effect.signal.wait_for(effect.condition, stop):
                    return
                value = True
            elif isinstance(effect, Collective):
                value = effect.group.join(effect.index, effect.value, stop)
                if value is CLOSED or (emulate and effect.seconds > 0 and stop.wait(effect.seconds)):
                    return
            else:
                raise TypeError(f"a role yielded {effect!r}; effects are Work, Collective, Wait")
    finally:
        role.close()  # runs the role's finally blocks (e.g. closing its collectives)


@contextlib.contextmanager
def _signals_stop(stop: threading.Event):
    """While the roles run, SIGINT and SIGTERM set `stop` instead of raising in the main thread.

    Python raises KeyboardInterrupt wherever the main thread happens to be, also inside a
    callback that C code invoked (a JAX garbage-collection hook), where it is printed and
    swallowed: the run went on as if no Ctrl-C had come. A handler that only sets a flag cannot
    be lost; `run_threaded` turns the flag into KeyboardInterrupt once the roles have stopped.
    Yields the list of signals received (empty outside the main thread: no handlers there).
    """
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum, frame):
        got.append(signum)
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_threaded(roles: list[RoleSpec], group: ThreadGroup, emulate_links: bool = True, on_poll:
                 Callable[[], None] | None = None, t0: float | None = None, poll_s=0.05) -> Schedule:
    """Run every role in its own thread of `group` (`on_poll` every `poll_s` s); returns when
    the foreground roles ended, with the seconds since `t0` (`time.perf_counter`; default now).

    Raises:
      The first exception of any role (the group is stopped and joined first), or
      KeyboardInterrupt on SIGINT or SIGTERM (after every role has stopped).
    """
    t0 = time.perf_counter() if t0 is None else t0
    lost: list[str] = []
    with _signals_stop(group.stop) as signals:
        try:  # a stop (a signal, a failed role) while the threads start: start no more
            started = [(group.spawn(_drive, r.role, group.stop, emulate_links, r.name, lost,
                                    name=r.name), r) for r in roles if not group.stop.is_set()]
            group.wait([t for t, r in started if r.foreground], on_poll=on_poll, poll_s=poll_s)
            seconds = time.perf_counter() - t0
        finally:
            left = group.close()
    group.raise_if_failed()
    if left:
        raise RuntimeError(f"threads did not stop within the timeout: {[t.name for t in left]}")
    if signals:
        raise KeyboardInterrupt(f"signal {signals[0]}")
    return Schedule(seconds, [], lost)


def run_virtual(roles: list[RoleSpec], on_event: Callable[[float], bool | None] | None = None
                ) -> Schedule:
    """Run the roles as one sequential schedule of events ordered by virtual time.

    Each role has at most one pending event; ties run in the order they were scheduled, so the
    schedule is deterministic. A `Wait` whose condition holds costs one event at the current
    time; one that does not parks the role, which is re-checked only after an event that
    notified its signal, and then resumes at that event's time. Ends when every foreground
    role has ended (background roles are closed); parties stuck in a collective whose peers
    have all ended are closed too. ``on_event(now)``, if given, is called after each role's
    event, when every role is suspended (progress records, evals: ``report.py``); when it
    returns True the run ends there (early stopping), every role closed where it stands.

    Worker computations are deferred to their first use and batched (``batched.py``).

    Raises:
      RuntimeError: every role left is parked on a `Wait` that no role can make true.
    """
    with batched.batching():  # at the end every pending computation runs (its metrics)
        return _run_virtual(roles, on_event)


def _run_virtual(roles: list[RoleSpec], on_event: Callable[[float], bool | None] | None
                 ) -> Schedule:
    heap: list[tuple[float, int, int]] = []
    seq = 0

    def schedule(t: float, i: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, i))
        seq += 1

    for i in range(len(roles)):
        schedule(0.0, i)
    values: list[Any] = [None] * len(roles)
    # A Work's transfers, still to go: a link is reserved when the transfer really starts (at
    # its event), so links serve transfers in time order, not in the order roles yielded.
    transfers: dict[int, tuple[list[tuple[Link, int]], float]] = {}
    parked: dict[int, dict[int, tuple[int, float, Any, float]]] = {}
    waiting: dict[int, tuple[Signal, int, list[tuple[int, Callable[[], bool]]]]] = {}
    fg_left = sum(r.foreground for r in roles)
    trace: list[int] = []
    now = 0.0
    try:
        while fg_left:
            if not heap:  # only parked roles left
                if waiting:
                    names = [roles[i].name for _, _, ws in waiting.values() for i, _ in ws]
                    raise RuntimeError(f"deadlock on the virtual clock: {names} wait on a "
                                       "condition that no running role can make true")
                break  # parties of a collective whose peers are gone
            now, _, i = heapq.heappop(heap)
            if i in transfers:
                left, pause = transfers[i]
                if left:
                    link, nbytes = left.pop(0)
                    schedule(link.virtual(now, nbytes), i)
                else:
                    del transfers[i]
                    schedule(now + pause, i)
                continue
            trace.append(i)
            try:
                effect = roles[i].role.send(values[i])
            except StopIteration:
                fg_left -= roles[i].foreground
                effect = None
            values[i] = None
            if isinstance(effect, Work):
                t = now + effect.seconds * effect.factor
                if effect.transfers:
                    transfers[i] = (list(effect.transfers), effect.pause)
                    schedule(t, i)
                else:
                    schedule(t + effect.pause, i)
            elif isinstance(effect, Wait):
                values[i] = True
                if effect.condition():
                    schedule(now, i)
                else:
                    sig = effect.signal
                    waiting.setdefault(id(sig), (sig, sig.generation, []))[2].append(
                        (i, effect.condition))
            elif isinstance(effect, Collective):
                g = effect.group
                party = parked.setdefault(id(g), {})
                party[effect.index] = (i, now, effect.value, effect.seconds)
                if len(party) == g.n:
                    del parked[id(g)]
                    result = g.reduce([party[k][2] for k in range(g.n)])
                    done = max(p[1] for p in party.values())
                    for k in range(g.n):
                        j, _, _, cost = party[k]
                        values[j] = result
                        schedule(done + cost, j)
            elif effect is not None:
                raise TypeError(f"role {roles[i].name} yielded {effect!r}; effects are Work, "
                                "Collective, Wait")
            for key, (sig, gen, ws) in list(waiting.items()):  # wake roles whose signal moved
                if sig.generation == gen:
                    continue
                ready = [(j, c) for j, c in ws if c()]
                left = [(j, c) for j, c in ws if (j, c) not in ready]
                for j, _ in ready:
                    schedule(now, j)
                if left:
                    waiting[key] = (sig, sig.generation, left)
                else:
                    del waiting[key]
            if on_event is not None and on_event(now):
                break
    finally:
        for r in roles:
            r.role.close()
    return Schedule(now, trace)
