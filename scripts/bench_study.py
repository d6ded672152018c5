"""A study's segments with the synthetic memo on and off (recjax/data/memo.py).

    python scripts/bench_study.py [--repeats 5] [--quick] [--json FILE]

The body, and its full description: algorithms/tools/bench_study.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_study import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
