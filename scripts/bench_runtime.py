"""Threaded-runtime overlap benchmark: is ShadowSync's sync really off the critical path?

    python scripts/bench_runtime.py [--repeats 5] [--quick]

The body, and its full description: algorithms/tools/bench_runtime.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_runtime import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
