"""Training throughput: `python scripts/bench.py [--quick] [--repeats 5] [--out FILE]`.

The body, and its full description: algorithms/tools/bench.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
