"""How a trainer stops on SIGINT or SIGTERM: at a step boundary, with a checkpoint.

Python's default SIGINT raises KeyboardInterrupt wherever the main thread is. Inside a jitted
step that has already taken the donated state, the step's result is lost with it, and the
Ctrl-C checkpoint then failed with "Array has been deleted" (issue 16, item 7); inside a JAX
callback it is printed and swallowed. SIGTERM, what a cluster scheduler sends before it kills,
ended the process with no checkpoint at all (item 5).

While a trainer runs under `stop_requests`, the first SIGINT or SIGTERM only records itself
(one line on stderr); the trainer reads `StopRequests.count` between steps, saves and stops.
A second signal means "stop now": with ``raise_on_second`` it raises KeyboardInterrupt at once
(a stuck data read or eval can be left); otherwise the trainer reads ``count >= 2`` itself (the
virtual clock, which must not be cut inside a role). A signal that arrives while a checkpoint
is written is held by `recjax.checkpoint` and delivered here after the commit. Blocks nest: the
signals an inner block received are handed to the enclosing one when it ends, so a caller that
runs trainers one after another (a study's segments) sees a signal that came as a run finished,
which the run itself had no step left to act on.

`exit_quietly` is for the very end: a Ctrl-C while Python shuts down (JAX's atexit hooks) used
to print a traceback after the run had already stopped with exit code 130, and a scheduler's
SIGTERM that came after a run had finished (summary written, before the process was gone) ended
it as killed (-15) although nothing was left to save (seen once in CI's fault cycles).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

_ACTIVE: list[StopRequests] = []  # innermost last: what `requested()` reads


class StopRequests:
    """The stop signals received while a trainer runs.

    Attributes:
      signals: the signal numbers received, in order.
      raise_on_second: a second signal raises KeyboardInterrupt in the main thread.
      on_signal: called with the signal number after each one is recorded (e.g. to set a
        thread group's stop flag).
    """

    def __init__(self, raise_on_second: bool = True,
                 on_signal: Callable[[int], None] | None = None):
        self.signals: list[int] = []
        self.raise_on_second = raise_on_second
        self.on_signal = on_signal

    @property
    def count(self) -> int:
        return len(self.signals)

    def handler(self, signum: int, frame) -> None:
        self.signals.append(signum)
        name = signal.Signals(signum).name
        if self.on_signal is not None:
            self.on_signal(signum)
        if len(self.signals) == 1:
            os.write(2, f"\n{name}: stopping at the next step boundary with a checkpoint "
                        "(send it again to stop at once)\n".encode())
        elif self.raise_on_second:
            raise KeyboardInterrupt(f"second stop signal ({name})")


@contextlib.contextmanager
def stop_requests(raise_on_second: bool = True,
                  on_signal: Callable[[int], None] | None = None) -> Iterator[StopRequests]:
    """Route SIGINT and SIGTERM to a `StopRequests` for the duration of the block.

    Outside the main thread no handler can be installed: the object then never counts a signal
    and the process keeps its default behaviour.
    """
    req = StopRequests(raise_on_second, on_signal)
    if threading.current_thread() is not threading.main_thread():
        yield req
        return
    old = {s: signal.signal(s, req.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    _ACTIVE.append(req)
    try:
        yield req
    finally:
        _ACTIVE.remove(req)
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
        if req.signals and _ACTIVE:  # an enclosing block (a study's segments) sees them too
            _ACTIVE[-1].signals.extend(req.signals)


def requested() -> int:
    """Stop signals received by the innermost active `stop_requests` (0 if none is active)."""
    return _ACTIVE[-1].count if _ACTIVE else 0


def exit_quietly(code: int) -> None:
    """From now on SIGINT and SIGTERM end the process at once with `code` (stdout and stderr
    flushed first), without running Python's (JAX's) exit hooks into a KeyboardInterrupt
    traceback. For a process whose work is done: call it from an entry point, never from code
    a test process runs (its Ctrl-C would then end pytest with `code`)."""
    def end(*_):
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # (a flush cut by this handler: reentrant)
                f.flush()
        os._exit(code)

    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, end)


def graceful(fn: Callable) -> Callable:
    """Decorate a trainer's entry point: it runs under `stop_requests` and reads
    `requested()` between its steps (a multi-process run: through ``agree``, so that all stop
    at one step). A call with ``checkpoints=False`` keeps Python's default signals: a run with
    nothing to save (a multi-process run without --out) ends at once on a SIGTERM."""
    import functools

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if kwargs.get("checkpoints", True) is False:
            return fn(*args, **kwargs)
        with stop_requests():
            return fn(*args, **kwargs)

    return wrapped
