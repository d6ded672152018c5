"""Two interpreters of the runtime's roles: real threads, or a deterministic virtual clock.

A *role* (a worker, a shadow thread) is a Python generator. It reads and writes shared state
(parameter servers, replicas) directly, and between those reads and writes it yields an
*effect* that says what the step cost or what it waits for:

* `Work(seconds, factor, transfers, pause)`: compute that took ``seconds`` of modelled time,
  slowed down ``factor`` x by the straggler model, then ``transfers`` over shared `Link`\\ s (a PS
  link serves one transfer at a time), then an idle ``pause``;
* `Collective(group, index, value, seconds)`: join the all-reduce `group` as party ``index``;
  the generator receives the group's reduction of every party's value.

`run_threaded` runs every role in its own thread (through `recjax.concurrency.ThreadGroup`):
compute is real, a straggler sleeps ``(factor - 1)`` x its measured compute time, a link is
held for ``bytes / bandwidth`` (``emulate_links``), a collective is a barrier (then held for
its ``seconds``). `run_virtual` runs the same generators one event at a time in the calling
thread, ordered by virtual time (ties by role index): the schedule, and therefore every
parameter, is a pure function of the seed. Reads happen when a role is resumed and writes
after its yield returns, so a role that yields a long `Work` really sees stale state, as it
would in the threaded run.
"""

from __future__ import annotations

import dataclasses
import heapq
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from recjax.concurrency import ThreadGroup

CLOSED = object()  # what a collective returns when the group shut down


@dataclasses.dataclass
class Link:
    """A PS network link: serves one transfer at a time at ``bandwidth`` bytes/s.

    Attributes:
      name: for summaries.
      bandwidth: bytes per second (``inf`` = free).
      free_at: virtual time when the link is next idle.
      busy: total seconds it spent transferring (virtual or emulated).
      bytes: total bytes moved.
    """

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
    """

    seconds: float = 0.0
    factor: float = 1.0
    transfers: tuple[tuple[Link, int], ...] = ()
    pause: float = 0.0


@dataclasses.dataclass(frozen=True)
class Collective:
    """Attributes:
      group: the `Rendezvous` to join.
      index: this party's index in [0, group.n).
      value: this party's contribution.
      seconds: modelled communication time of the collective for each party.
    """

    group: Rendezvous
    index: int
    value: Any
    seconds: float = 0.0


class Rendezvous:
    """A reusable n-party all-reduce: every party gets ``reduce([v_0, ..., v_{n-1}])``.

    The reduction sees the values in party order whatever the arrival order, so it is
    deterministic. `close` releases every waiting party with `CLOSED` (a party left for good).
    """

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


Role = Generator[Work | Collective, Any, None]


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """Attributes:
      name: thread name / trace label.
      role: the generator.
      foreground: the run ends when every foreground role has ended; background roles
        (shadow threads) are then stopped.
    """

    name: str
    role: Role
    foreground: bool = True


@dataclasses.dataclass
class Schedule:
    """What an interpreter reports. Attributes:
      seconds: wall seconds (threaded) or virtual seconds (virtual) until the foreground ended.
      trace: role indices in the order their events ran (virtual mode only).
    """

    seconds: float
    trace: list[int]


def _drive(role: Role, stop: threading.Event, emulate: bool) -> None:
    """Thread body: run one role's effects for real until it ends or `stop` is set."""
    value = None
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                effect = role.send(value)
            except StopIteration:
                return
            value = None
            if isinstance(effect, Work):
                extra = (effect.factor - 1.0) * (time.perf_counter() - t0)
                if extra > 0 and stop.wait(extra):
                    return
                for link, nbytes in effect.transfers:
                    if not link.hold(nbytes, stop, emulate):
                        return
                if effect.pause > 0 and stop.wait(effect.pause):
                    return
            else:
                value = effect.group.join(effect.index, effect.value, stop)
                if value is CLOSED or (emulate and effect.seconds > 0 and stop.wait(effect.seconds)):
                    return
    finally:
        role.close()  # runs the role's finally blocks (e.g. closing its collectives)


def run_threaded(roles: list[RoleSpec], group: ThreadGroup, emulate_links: bool = True,
                 on_poll: Callable[[], None] | None = None) -> Schedule:
    """Run every role in its own thread of `group`; returns when the foreground roles ended.

    Raises:
      The first exception of any role (the group is stopped and joined first), or
      KeyboardInterrupt.
    """
    t0 = time.perf_counter()
    threads = [group.spawn(_drive, r.role, group.stop, emulate_links, name=r.name) for r in roles]
    try:
        group.wait([t for t, r in zip(threads, roles) if r.foreground], on_poll=on_poll)
        seconds = time.perf_counter() - t0
    finally:
        left = group.close()
    group.raise_if_failed()
    if left:
        raise RuntimeError(f"threads did not stop within the timeout: {[t.name for t in left]}")
    return Schedule(seconds, [])


def run_virtual(roles: list[RoleSpec]) -> Schedule:
    """Run the roles as one sequential schedule of events ordered by virtual time.

    Each role has at most one pending event; ties are broken by role index, so the schedule is
    deterministic. Ends when every foreground role has ended (background roles are closed);
    parties stuck in a collective whose peers have all ended are closed too.
    """
    heap = [(0.0, i) for i in range(len(roles))]
    values: list[Any] = [None] * len(roles)
    parked: dict[int, dict[int, tuple[int, float, Any, float]]] = {}
    groups: dict[int, Rendezvous] = {}
    fg_left = sum(r.foreground for r in roles)
    trace: list[int] = []
    now = 0.0
    try:
        while fg_left:
            if not heap:  # only parked roles left: their peers are gone
                break
            now, i = heapq.heappop(heap)
            trace.append(i)
            try:
                effect = roles[i].role.send(values[i])
            except StopIteration:
                fg_left -= roles[i].foreground
                continue
            values[i] = None
            if isinstance(effect, Work):
                t = now + effect.seconds * effect.factor
                for link, nbytes in effect.transfers:
                    t = link.virtual(t, nbytes)
                heapq.heappush(heap, (t + effect.pause, i))
                continue
            g = effect.group
            groups[id(g)] = g
            party = parked.setdefault(id(g), {})
            party[effect.index] = (i, now, effect.value, effect.seconds)
            if len(party) == g.n:
                del parked[id(g)]
                result = g.reduce([party[k][2] for k in range(g.n)])
                done = max(p[1] for p in party.values())
                for k in range(g.n):
                    j, _, _, cost = party[k]
                    values[j] = result
                    heapq.heappush(heap, (done + cost, j))
    finally:
        for r in roles:
            r.role.close()
    return Schedule(now, trace)
