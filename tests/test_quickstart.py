"""The README's Quickstart: every command runs and reaches the numbers it states.

Each command in the README's "Quickstart per dataset" block is preceded by a comment that ends
in ``-> valid AUC ~0.70, NE ~0.93`` (or ``hold-out AUC``, ``train NE``): this test parses them,
runs each command (with ``--out`` in a temporary directory) on the shared data samples, and
checks each stated number within `TOLERANCE` (also stated in the README), plus what every
command must reach: a finite AUC and an eval NE below 1. Commands whose data is absent skip.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from recjax import cli
from recjax.data.synthetic import synthetic_name
from tests.conftest import DATA, ROOT

TOLERANCE = {"eval_auc": 0.02, "eval_ne": 0.03, "train_ne": 0.03}
_WORDS = {"AUC": "eval_auc", "NE": "eval_ne", "train NE": "train_ne"}


def quickstart() -> list[tuple[str, list[str], dict[str, float]]]:
    """(comment, argv, {summary key: stated value}) for each command of the Quickstart block."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart per dataset", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    out, comment = [], ""
    for line in lines:
        line = line.strip()
        if line.startswith("#"):
            comment = line
        elif line.startswith("python scripts/train.py"):
            stated = {}
            if "->" in comment:
                for word, value in re.findall(r"(train NE|NE|AUC) ~([0-9.]+)",
                                              comment.split("->", 1)[1]):
                    stated[_WORDS[word]] = float(value)
            out.append((comment, shlex.split(line)[2:], stated))
            comment = ""
    return out


COMMANDS = quickstart()


def test_every_quickstart_command_states_what_it_reaches():
    assert len(COMMANDS) >= 8
    for comment, argv, stated in COMMANDS:
        assert "eval_auc" in stated and "eval_ne" in stated, (comment, argv)
        assert stated["eval_ne"] < 1, comment
        assert "--steps" not in argv or int(argv[argv.index("--steps") + 1]) >= 100, argv


def _data_missing(argv: list[str]) -> str | None:
    cfg, _ = cli.parse(argv, "t")
    for spec in (cfg.data.train, cfg.data.eval):
        if not spec or synthetic_name(spec) is not None or spec.startswith("synthetic-seq"):
            continue  # generated data, no file
        path = spec.partition(":")[2]
        here = ROOT / path
        if not here.exists() and not (DATA / path).exists() and not (
                DATA / path.replace("../shared/data/", "")).exists():
            return f"data sample {path} not present (set RECJAX_DATA to the data folder)"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("comment,argv,stated", COMMANDS, ids=[" ".join(a[:4]) for _, a, _ in COMMANDS])
def test_quickstart_command_reaches_its_stated_numbers(tmp_path, comment, argv, stated):
    missing = _data_missing(argv)
    if missing:
        pytest.skip(missing)
    if "--out" in argv:
        i = argv.index("--out")
        argv = argv[:i] + argv[i + 2:]
    cmd = [sys.executable, "scripts/train.py", *argv, "--out", str(tmp_path / "run"),
           "--no-progress"]
    env = dict(os.environ)
    if "RECJAX_DATA" not in env and not (ROOT.parent / "shared" / "data").exists():
        env["RECJAX_DATA"] = str(DATA)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["eval_auc"] is not None and s["eval_ne"] is not None and s["eval_ne"] < 1, s
    for key, value in stated.items():
        assert abs(s[key] - value) <= TOLERANCE[key], (comment, key, s[key], value)
