"""Input throughput, text and Parquet: `python scripts/bench_data.py [--rows N] [--repeats 5]`.

The body, and its full description: recjax/tools/bench_data.py (also `scripts/bench.py --sections
data`).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.bench_data import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
