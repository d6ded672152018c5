"""Run a grid of scripts/train.py runs, one subdirectory per point, skipping finished ones.

    python scripts/sweep.py --config criteo --sweep dense.lr=0.01,0.1 --sweep seed=1,2 \\
        --out runs/sw [-- other scripts/train.py arguments]
    python scripts/collect.py runs/sw/*          # the table of the runs

A ``--sweep KEY=V1,V2,...`` key is a config key (``section.field``) or a fixed flag of train.py
(``seed``, ``model``, ``batch-size``, ...). The grid is their product, run sequentially in that
order; point ``dense.lr=0.01_seed=1`` writes to ``OUT/dense.lr=0.01_seed=1/`` (its summary.json,
metrics.jsonl, checkpoints, and ``train.log``: the run's own output). A point with a readable
summary.json is done and skipped; one with checkpoints but no summary (interrupted) is resumed;
a damaged summary.json (cut, empty, not a run's) is moved aside and the point run again. Every point's
config is resolved before the first run starts, so a bad key or value stops the sweep at once.
"""

import argparse
import itertools
import os
import pathlib
import subprocess
import sys
import time

from recjax import cli
from recjax.config import ConfigError
from recjax.runlog import read_summary

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: scripts/train.py runs each point


def parse_sweep(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    vals = [v for v in values.split(",") if v]
    if not sep or not key or not vals:
        raise ConfigError(f"--sweep {text!r}: write KEY=V1,V2,... (e.g. dense.lr=0.01,0.1)")
    if "." not in key and key.replace("-", "_") not in cli.FLAGS:
        raise ConfigError(f"--sweep {text!r}: {key!r} is neither a config key (section.field) nor "
                          f"a fixed flag ({', '.join(f.replace('_', '-') for f in cli.FLAGS)})")
    return key, vals


def point_args(point: dict[str, str]) -> list[str]:
    """scripts/train.py arguments that set one grid point."""
    return [f"--{k}={v}" if "." in k else f"--{k.replace('_', '-')}={v}" for k, v in point.items()]


def point_name(point: dict[str, str]) -> str:
    return "_".join(f"{k}={v}" for k, v in point.items()).replace("/", "%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--config", default="default", help="as scripts/train.py --config")
    p.add_argument("--sweep", action="append", required=True, metavar="KEY=V1,V2",
                   help="a swept key and its values (repeat for a grid)")
    p.add_argument("--out", required=True, help="sweep directory: one subdirectory per point")
    args, rest = p.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    try:
        axes = [parse_sweep(s) for s in args.sweep]
    except ConfigError as e:
        p.error(str(e))
    keys = [k for k, _ in axes]
    points = [dict(zip(keys, vals)) for vals in itertools.product(*(v for _, v in axes))]
    train_parser = cli.parser("train")
    for point in points:  # resolve every config first: a typo fails now, not after hours
        targs, trest = train_parser.parse_known_args(["--config", args.config, *rest,
                                                      *point_args(point)])
        try:
            cli.resolve(targs, trest)
        except (ConfigError, ValueError) as e:
            p.error(f"point {point_name(point)}: {e}")
    os.makedirs(args.out, exist_ok=True)
    failed = 0
    for i, point in enumerate(points, 1):
        name = point_name(point)
        out = os.path.join(args.out, name)
        head = f"[{i}/{len(points)}] {name}:"
        summary = os.path.join(out, "summary.json")
        done, why = read_summary(summary)
        if done is not None:
            print(f"{head} done already (summary.json)", flush=True)
            continue
        if os.path.lexists(summary):  # damaged: not a finished point; kept aside, rerun
            aside = f"{summary}.damaged-{int(time.time())}"
            os.replace(summary, aside)
            print(f"{head} {why}; moved to {os.path.basename(aside)}, running the point again",
                  flush=True)
        resume = ["--resume"] if os.path.isdir(os.path.join(out, "checkpoints")) and os.listdir(
            os.path.join(out, "checkpoints")) else []
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", args.config, *rest,
               *point_args(point), "--out", out, "--no-progress", *resume]
        os.makedirs(out, exist_ok=True)
        t = time.perf_counter()
        with open(os.path.join(out, "train.log"), "a") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        secs = time.perf_counter() - t
        s, why = read_summary(summary)
        if rc != 0 or s is None:
            failed += 1
            print(f"{head} FAILED (exit {rc}, {secs:.0f} s; {why or 'no summary'}); see "
                  f"{out}/train.log", flush=True)
            continue
        metrics = "  ".join(f"{k} {s[k]:.4f}" for k in ("train_ne", "eval_auc", "eval_ne")
                            if isinstance(s.get(k), float))
        print(f"{head} {metrics}  ({'resumed, ' if resume else ''}{secs:.0f} s)", flush=True)
    print(f"{len(points) - failed}/{len(points)} points finished in {args.out}; table: "
          f"python scripts/collect.py {args.out}/*")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
