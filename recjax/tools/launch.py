"""Run N local processes of an SPMD command through jax.distributed (docs/distributed.md).

    python scripts/launch.py --num-processes 2 -- python scripts/train.py --algo des --model fm ...

Each process gets ``--spmd.coordinator=127.0.0.1:PORT --spmd.num_processes=N
--spmd.process_id=i`` appended (a free port unless ``--port``); on a CPU host JAX then runs
gloo collectives between them (PERF_NOTES item 8). Process 0 writes ``--out``; every process
writes its own shards of the checkpoints.

Stops: a signal to launch.py (SIGINT, SIGTERM) or ``--timeout`` is sent on to every process as
SIGTERM (they stop together at the next step boundary with one checkpoint and exit 130). When
one process ends with a non-zero status the others are sent SIGTERM too, unless it ended with
130 (a stop they are making with it); any still running ``--grace`` seconds later is killed
(SIGKILL): a process waiting in a collective for a peer that died cannot reach a step
boundary. The exit status is the first non-zero one (124 on the timeout).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], n: int, port: int = 0, host: str = "127.0.0.1",
           timeout: float | None = None, quiet: bool = False, grace: float = 30.0) -> int:
    """Start `n` copies of `cmd` as one jax.distributed job; wait; return the exit status.

    With `quiet`, the processes' stdout is discarded (stderr is kept)."""
    port = port or free_port()
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env.pop("XLA_FLAGS", None)  # a forced device count would multiply each process's devices
    procs = [subprocess.Popen(cmd + [f"--spmd.coordinator={host}:{port}",
                                     f"--spmd.num_processes={n}", f"--spmd.process_id={i}"]
                              + ([] if i == 0 else ["--no-progress"]), env=env,
                              stdout=subprocess.DEVNULL if quiet else None)
             for i in range(n)]
    deadline = None if timeout is None else time.monotonic() + timeout
    rc, kill_at = 0, None

    def stop(sig) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    def on_signal(signum, frame):  # pass a Ctrl-C or a scheduler's SIGTERM on to every process
        nonlocal kill_at
        stop(signal.SIGTERM)
        kill_at = kill_at or time.monotonic() + grace

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while [p.poll() for p in procs].count(None):  # poll every one: their first failure
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if kill_at is None and (failed or (deadline and time.monotonic() > deadline)):
                rc = failed[0] if failed else 124
                if rc != 130:  # 130: a stop the others make with it (one signal, seen by all)
                    stop(signal.SIGTERM)
                kill_at = time.monotonic() + grace
            if kill_at is not None and time.monotonic() > kill_at:
                stop(signal.SIGKILL)
            time.sleep(0.1)
    finally:
        stop(signal.SIGKILL)
        for p in procs:
            p.wait()
        for s, h in old.items():
            signal.signal(s, h)
    return rc or next((p.returncode for p in procs if p.returncode), 0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: launch.py --num-processes N [--port P] -- COMMAND ...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before all are stopped")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds a process has to end after a stop or a peer's failure before "
                        "it is killed (default 30)")
    args = p.parse_args(argv[:cut])
    return launch(argv[cut + 1:], args.num_processes, args.port, timeout=args.timeout,
                  grace=args.grace)


if __name__ == "__main__":
    raise SystemExit(main())
