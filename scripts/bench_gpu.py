"""DLRM training throughput on one accelerator, at several batch sizes: `python scripts/bench_gpu.py`.

    python scripts/bench_gpu.py --batch-sizes 4096,16384,65536 --repeats 7

The body, and its full description: algorithms/tools/bench_gpu.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.bench_gpu import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
