"""Run N local processes of an SPMD command through jax.distributed (docs/distributed.md).

    python scripts/launch.py --num-processes 2 -- python scripts/train.py --algo des --model fm ...

The body, and its full description: recjax/tools/launch.py.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax.tools.launch import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
