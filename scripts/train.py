"""Train a CTR model: `python scripts/train.py [--model M] [--algo A] [--data SPEC] ... [--out DIR]`.

With no arguments: DLRM on the built-in synthetic data (see recjax/configs.py `default`).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from algorithms.train_main import main  # noqa: E402
from recjax.train.signals import exit_quietly  # noqa: E402

if __name__ == "__main__":
    code = main()
    exit_quietly(code)  # the run is over: a late SIGTERM/Ctrl-C ends it with its own code
    raise SystemExit(code)
