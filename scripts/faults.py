"""Kill, interrupt and resume training runs at random moments; check nothing is lost or changed.

    python scripts/faults.py                      # 3 cycles each of single, sync, shadow (minutes)
    python scripts/faults.py --cycles 20 --algos shadow --seed 3 --json faults.json
    python scripts/faults.py --out-cases          # the --out policy of 2-process runs
    python scripts/faults.py --ray-cases all      # kill -9 of PS0, raylet, GCS (twice), driver
    python scripts/faults.py --processes 2 --cycles 10   # 2-process sync (jax.distributed)

The body, and its full description: recjax/tools/faults.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.faults import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
