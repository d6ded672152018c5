"""DES communication-saving ratios on Criteo-shaped batches (docs/des.md, paper Table 2).

    python scripts/des_comm.py [--shards 8] [--embed-dim 16] [--hidden 400] [--out docs/des_comm.json]

The body, and its full description: algorithms/tools/des_comm.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.tools.des_comm import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
