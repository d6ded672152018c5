"""The host-async DLRM step with the dynamic-id LRU store vs fixed tables (Persia Sec. 4.2.2).

    python scripts/bench_lru.py [--repeats 5] [--quick]

The body, and its full description: algorithms/tools/bench_lru.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_lru import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
