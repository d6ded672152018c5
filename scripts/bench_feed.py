"""Does the input pipeline keep the accelerator busy? `python scripts/bench_feed.py [--quick]`.

The body, and its full description: algorithms/tools/bench_feed.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_feed import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
