"""A watchdog over the engine's roles: one that makes no progress for a while is named, its
stack printed, and the run stopped with a checkpoint (issue 16, item 10).

A worker or PS call that blocks instead of raising (a lost connection without a timeout, a
lock never released) used to hang a threaded run forever: every other role waited on it and
nothing said which. Each role's generator is wrapped (`Watchdog.watch`) so that every effect it
yields and every value it gets back is a heartbeat; `Watchdog.check`, called from the main
thread's poll loop (``ThreadGroup.wait``'s ``on_poll``; no thread of its own), raises
`RoleStalledError` when a live role's last heartbeat is older than ``runtime.watchdog_s``.
That error goes the way of a Ctrl-C (`Runtime.execute`): every role is told to stop, the roles'
state is checkpointed, the run ends with the message. A role parked on a ``Wait`` counts as
stalled too: waiting that long on another role is a hang of that one, and every stalled role
is named, the longest-silent first.

On the virtual clock every role runs in the calling thread, one event at a time; a call that
blocks there blocks the interpreter itself, and there is no network (``--deterministic``
excludes ``--backend ray``), so the watchdog watches threaded and Ray runs only.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback


class RoleStalledError(TimeoutError):
    """A role made no progress for ``runtime.watchdog_s`` seconds."""


class Watchdog:
    """Heartbeats of the roles of one run, and the check.

    Args:
      names: the roles' names, in role order.
      timeout_s: seconds without a heartbeat before a role counts as stalled (0 = never).
    """

    def __init__(self, names: list[str], timeout_s: float):
        self.names, self.timeout_s = names, timeout_s
        now = time.monotonic()
        self.beats: list[float | None] = [now] * len(names)  # None: the role has ended

    def watch(self, i: int, role):
        """Role `i`'s generator, beating before each step of it and after each effect."""
        value = None
        try:
            while True:
                self.beats[i] = time.monotonic()
                try:
                    effect = role.send(value)
                except StopIteration:
                    return
                self.beats[i] = time.monotonic()
                value = yield effect
        finally:
            self.beats[i] = None
            role.close()

    def stalled(self) -> list[tuple[str, float]]:
        """``(name, seconds silent)`` of every live role silent past the timeout, longest first."""
        if not self.timeout_s:
            return []
        now = time.monotonic()
        late = [(n, now - b) for n, b in zip(self.names, self.beats)
                if b is not None and now - b > self.timeout_s]
        return sorted(late, key=lambda x: -x[1])

    def check(self, thread_prefix: str = "") -> None:
        """Raise `RoleStalledError` if a role is stalled, after printing its stack (the thread
        named ``thread_prefix + name``) to stderr.

        Raises:
          RoleStalledError: naming every stalled role and where the first one is stuck.
        """
        late = self.stalled()
        if not late:
            return
        name, silent = late[0]
        where = "(no thread of that name: its stack is unknown)"
        threads = {t.name: t for t in threading.enumerate()}
        t = threads.get(thread_prefix + name)
        frame = sys._current_frames().get(t.ident) if t is not None else None
        if frame is not None:
            stack = traceback.format_stack(frame)
            print(f"recjax watchdog: role {name} made no progress for {silent:.1f} s; its "
                  "stack (most recent call last):\n" + "".join(stack), file=sys.stderr,
                  flush=True)
            where = "at " + stack[-1].strip().splitlines()[0]
        others = ", ".join(f"{n} ({s:.0f} s)" for n, s in late[1:])
        raise RoleStalledError(
            f"role {name} made no progress for {silent:.1f} s (runtime.watchdog_s="
            f"{self.timeout_s:g}); it is stuck {where}"
            + (f"; also silent: {others}" if others else "")
            + ". The run stopped (with --out: checkpointed as the roles left it; --resume "
            "goes on from there once the cause is fixed: a lost PS or worker process, a lock), "
            "or raise --runtime.watchdog_s if that role is only slow")
