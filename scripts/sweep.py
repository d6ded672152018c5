"""Run a grid of scripts/train.py runs, one subdirectory per point, skipping finished ones.

    python scripts/sweep.py --config criteo --sweep dense.lr=0.01,0.1 --sweep seed=1,2 \
        --out runs/sw [-- other scripts/train.py arguments]
    python scripts/collect.py runs/sw/*          # the table of the runs

The body, and its full description: recjax/tools/sweep.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.sweep import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
