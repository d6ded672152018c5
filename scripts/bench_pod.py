"""The cost of multi-process checkpoints: async save overhead per interval, restore time.

    python scripts/bench_pod.py [--config dlrm_kaggle] [--every 50] [--repeats 5]

The body, and its full description: algorithms/tools/bench_pod.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_pod import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
