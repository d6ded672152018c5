"""What is left of a local Ray instance when its driver is gone (docs/distributed.md, "Failures").

`ray_backend.Cluster` starts this file as a process of its own session (no terminal signal
reaches it) and writes ``pid start_time`` lines to its stdin. At EOF (the driver stopped, or
was killed -9 and the kernel closed the pipe) it SIGKILLs the listed processes that still run
and every process whose environment carries ``MARK=token``: without it, Ray's agents outlive
a killed driver by ~40 s. Run as a script, it imports only the standard library.

    python algorithms/runtime/reaper.py TOKEN  < pid lines
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

MARK = "RECJAX_RAY_INSTANCE"  # in the environment of every process of a local instance


def start_time(pid: int | str) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): with the pid, names a process
    (None: it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def marked(token: str) -> list[int]:
    """The processes of this host, this one aside, whose environment carries ``MARK=token``."""
    needle, out = f"{MARK}={token}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:  # gone, or another user's
            continue
    return [p for p in out if p != os.getpid()]


def kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            os.kill(pid, signal.SIGKILL)


def main(token: str) -> None:
    listed = [line.split() for line in sys.stdin if line.strip()]
    kill([int(p) for p, t in listed if start_time(p) == t] + marked(token))


if __name__ == "__main__":
    main(sys.argv[1])
