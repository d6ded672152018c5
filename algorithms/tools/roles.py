"""What a benchmark times of a run it starts through `algorithms.run`: the roles' run.

`algorithms.run` keeps its engine to itself, and what a run does after its roles (the final
evaluation; under Ray, stopping the run's local instance, seconds) is not the roles' time.
`timed` notes, for the engine of each host-async run inside, the process CPU time its roles'
run took (`Runtime.execute`: compile under Ray, then the roles) and when it ended.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timed() -> Iterator[dict]:
    """``{"cpu_seconds": CPU seconds of every thread of the process, "end": perf_counter}`` of
    the latest roles' run inside (`Runtime.execute`, wrapped while inside)."""
    from algorithms.runtime.engine import Runtime

    execute, out = Runtime.execute, {}

    def measured(self, *args, **kwargs):
        c0 = time.process_time()
        try:
            return execute(self, *args, **kwargs)
        finally:
            out["cpu_seconds"], out["end"] = time.process_time() - c0, time.perf_counter()

    Runtime.execute = measured
    try:
        yield out
    finally:
        Runtime.execute = execute
