"""The body of `scripts/train.py` (which stays a thin entry point): parse the command line,
run the algorithm, print the summary. Tests call `main` in-process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from recjax import cli

DESCRIPTION = ("Train a CTR model: `python scripts/train.py [--model M] [--algo A] "
               "[--data SPEC] ... [--out DIR]`.")
SUMMARY_KEYS = ["algorithm", "model", "dataset", "eval_dataset", "steps", "examples", "wall_seconds",
                "examples_per_sec", "train_ne", "eval_auc", "eval_logloss", "eval_ne",
                "eval_calibration", "bayes_eval_ne", "eval_ne_gap_to_bayes"]


def main(argv=None) -> int:
    """`scripts/train.py`: parse, run, print the summary; 2 on bad input, 130 on Ctrl-C."""
    cfg, args = cli.parse(argv, DESCRIPTION)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from recjax import compile_cache

    compile_cache.enable(cfg.train.compile_cache)
    import algorithms  # after parsing: --help stays instant

    # the summary is printed and the returned state dropped: a Ray run's driver need not
    # gather the tables for it (they stay in their shard actors; other backends ignore it)
    cfg = dataclasses.replace(cfg, ray=dataclasses.replace(cfg.ray, final_tables=False))

    try:
        summary = algorithms.run(cfg)
    except (ValueError, OSError) as e:  # bad input/config/paths: a message, not a traceback
        if args.debug:
            raise
        print(f"error: {e}\n(run with --debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from recjax.train.signals import exit_quietly

        exit_quietly(130)  # a further Ctrl-C while JAX shuts down: no atexit traceback
        print("interrupted; the last checkpoint (if --out was given) is intact", file=sys.stderr)
        return 130
    if "stopped_at" in summary:
        return 0
    width = max(map(len, SUMMARY_KEYS))
    for k in SUMMARY_KEYS:
        if summary.get(k) is not None:
            v = summary[k]
            if k == "examples_per_sec" and summary.get("clock") == "virtual":
                k = "examples_per_virtual_sec"  # a modelled rate, not a measured one
            if isinstance(v, float) and v != v:  # NaN: undefined (e.g. a one-class eval set)
                print(f"{k:>{width}}  unavailable (see the warning above)")
                continue
            print(f"{k:>{width}}  {v:.4f}" if isinstance(v, float) else f"{k:>{width}}  {v}")
    if summary.get("days"):  # --data.eval_protocol=next_day
        from recjax.train import days

        print(days.table_text(summary["days"]))
    if cfg.train.out:
        print(f"{'out':>{width}}  {os.path.abspath(cfg.train.out)}")
    return 0
