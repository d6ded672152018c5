"""Persia's three modes (hybrid, sync, async) under an embedding straggler: throughput in one run.

    python scripts/bench_persia.py [--repeats 5] [--steps 600] [--out runs/bench_persia.json]

The body, and its full description: algorithms/tools/bench_persia.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_persia import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
