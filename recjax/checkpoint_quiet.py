"""Quiet orbax: its log lines and asyncio's echoes of a failed save, which the save's own
one-line error already says (`recjax.checkpoint`)."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from collections.abc import Iterator

from absl import logging as absl_logging


def is_closed_loop_echo(exc: BaseException | None, tb=None) -> bool:
    """A ``RuntimeError: Event loop is closed`` raised by asyncio's ``call_soon_threadsafe``
    called from outside Python (its traceback starts there), nothing else."""
    tb = tb if tb is not None else getattr(exc, "__traceback__", None)
    return (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
            and tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe")


# the coroutine orbax's serialization gathers, one per array fragment (orbax-checkpoint 0.11)
ORBAX_UNAWAITED = r"coroutine 'async_serialize_from_host\.<locals>\.write_fragment' was never awaited"


def is_orbax_unretrieved(message: str) -> bool:
    """asyncio's log line for a failed task or future nobody awaited, where it is orbax's."""
    return re.match(r"\w+ exception was never retrieved\n", message) is not None and "orbax" in message


def _not_orbax_unretrieved(record: logging.LogRecord) -> bool:
    return not is_orbax_unretrieved(record.getMessage())


def mute_closed_loop_echoes() -> None:
    """When a save fails, tensorstore's writes still in flight complete into the event loop
    orbax already closed, and each prints ``RuntimeError: Event loop is closed`` with a
    traceback (99 of them behind a full disk's one message); asyncio logs orbax's failed writer
    tasks and the futures that gather them as "<class> exception was never retrieved"; and at
    exit each writer coroutine a failed gather never started warns that it "was never awaited"
    (a full disk under load: 16 lines after the one error, 1 run in 6). Those echoes, and only
    those (`is_closed_loop_echo`, `is_orbax_unretrieved`, `ORBAX_UNAWAITED`), are not printed:
    the save's own error says what happened. Idempotent; the warning filter is put back on
    every call (`warnings.catch_warnings`, as pytest's around each test, drops it on exit)."""
    logging.getLogger("asyncio").addFilter(_not_orbax_unretrieved)  # once: it is one object
    warnings.filterwarnings("ignore", category=RuntimeWarning, message=ORBAX_UNAWAITED)
    if getattr(sys.excepthook, "_recjax_mute", False):
        return
    hook, unraisable = sys.excepthook, sys.unraisablehook

    def excepthook(kind, value, tb):
        if not is_closed_loop_echo(value, tb):
            hook(kind, value, tb)

    def unraisablehook(info):
        if not is_closed_loop_echo(info.exc_value, info.exc_traceback):
            unraisable(info)

    excepthook._recjax_mute = True
    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook


@contextlib.contextmanager
def orbax_quiet() -> Iterator[None]:
    """orbax's writer threads log every failed write as an ERROR with a traceback (a full disk:
    ~140 lines before the run's own message); the save's exception carries the first of them
    and `Checkpointer.save` turns it into one line, so nothing is logged meanwhile."""
    mute_closed_loop_echoes()  # a failing write echoes while the save still runs
    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.FATAL)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)
