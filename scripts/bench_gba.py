"""GBA and its five baselines under stragglers: global QPS of all six modes in one run.

    python scripts/bench_gba.py [--repeats 5] [--quick] [--json FILE]

The body, and its full description: algorithms/tools/bench_gba.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_gba import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
