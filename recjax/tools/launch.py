"""Run N local processes of an SPMD command through jax.distributed (docs/distributed.md).

    python scripts/launch.py --num-processes 2 -- python scripts/train.py --algo des --model fm ...

Each process gets ``--spmd.coordinator=127.0.0.1:PORT --spmd.num_processes=N
--spmd.process_id=i`` appended (a free port unless ``--port``); on a CPU host JAX then runs
gloo collectives between them (PERF_NOTES item 8). Process 0 writes ``--out``. If one process
fails the others are stopped; the exit status is the first non-zero one.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], n: int, port: int = 0, host: str = "127.0.0.1",
           timeout: float | None = None, quiet: bool = False) -> int:
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
    rc = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or (deadline and time.monotonic() > deadline):
                rc = failed[0] if failed else 124
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
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
    args = p.parse_args(argv[:cut])
    return launch(argv[cut + 1:], args.num_processes, args.port, timeout=args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
