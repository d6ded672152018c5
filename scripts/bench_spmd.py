"""Throughput of the SPMD algorithms vs the single-device trainer at equal global batch.

    python scripts/bench_spmd.py [--repeats 5] [--quick]

The body, and its full description: recjax/tools/bench_spmd.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.bench_spmd import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
