"""Virtual-clock speed: GBA at 32 workers and ShadowSync at 16 trainers against the single
trainer, wall examples/sec and the ratio (issue 35).

    python scripts/bench_clock.py [--repeats 5] [--quick] [--eager | --with-eager] [--json FILE]

The body, and its full description: algorithms/tools/bench_clock.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_clock import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
