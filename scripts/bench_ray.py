"""Ray backend benchmark: the price of processes, the engine's scaling, one call's overhead.

    python scripts/bench_ray.py [--repeats 5] [--quick] [--json FILE]

The body, and its full description: algorithms/tools/bench_ray.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_ray import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
