"""Command-line plumbing shared by the scripts: flags -> `Config` (DESIGN.md section 3 names)."""

from __future__ import annotations

import argparse
import dataclasses

from recjax import config_files, configs, registry
from recjax.config import Config, ConfigError, apply_overrides
from recjax.config_help import help_text
from recjax.data.synthetic import preset, synthetic_name
from recjax.models.config import MODEL_NAMES, SEQUENCE_MODEL_NAMES

# Fixed flag -> config key (users, docs and checks rely on these names).
FLAGS = {
    "model": "model.name", "algo": "train.algo", "data": "data.train", "eval_data": "data.eval",
    "epochs": "train.epochs", "steps": "train.steps", "batch_size": "train.batch_size",
    "seed": "train.seed", "out": "train.out", "devices": "train.devices",
    "mesh": "spmd.mesh", "trainers": "runtime.trainers",
    "workers_per_trainer": "runtime.workers_per_trainer", "sync": "shadowsync.sync",
    "sync_gap": "shadowsync.sync_gap", "stragglers": "runtime.stragglers",
    "backend": "runtime.backend",
}
SWITCHES = {
    "save_predictions": "train.save_predictions", "deterministic": "train.deterministic",
    "resume": "train.resume", "skip_bad_lines": "data.skip_bad_lines",
    "tensorboard": "train.tensorboard",
}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=description, allow_abbrev=False,
        epilog="Any config field can be set with --section.field=value "
               "(see --help-config for all of them with their current values).")
    p.add_argument("--config", default="default",
                   help=f"named config ({', '.join(configs.CONFIGS)}) or a config file: .py "
                        "(config() or CONFIG), .json/.yaml (nested sections), or a run's "
                        "summary.json (reruns it; pass a new --out)")
    p.add_argument("--model", help=" | ".join(MODEL_NAMES) + " | sequence models (data with a "
                                   "behaviour sequence): " + " | ".join(SEQUENCE_MODEL_NAMES))
    p.add_argument("--algo", help=registry.help_line())
    p.add_argument("--data", help="criteo:PATH | criteo-csv:PATH | avazu:PATH | frappe:PATH | "
                                  "movielens:PATH | taobao:PATH | parquet:DIR (scripts/convert.py) | "
                                  "seq:KIND:PATH (a multi-hot field as position fields, for "
                                  "--model din or bst) | synthetic[:NAME] | synthetic-seq[:key=value,...]")
    p.add_argument("--eval-data", help="eval data SPEC (default: a seeded hold-out split)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--steps", type=int, help="train this many steps (overrides --epochs)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--out", help="run directory: summary.json, metrics.jsonl, checkpoints/")
    p.add_argument("--devices", type=int, help="devices (fake CPU devices on a CPU host)")
    p.add_argument("--mesh", help="SPMD mesh axes, e.g. data=4,model=2")
    p.add_argument("--trainers", type=int, help="host-async runtime: trainers")
    p.add_argument("--workers-per-trainer", type=int, help="host-async runtime: worker threads")
    p.add_argument("--sync", help="sync rule: easgd | ma | bmuf")
    p.add_argument("--sync-gap", type=int, help="foreground sync every k iterations")
    p.add_argument("--stragglers", help="straggler model: none | lognormal:sigma=0.5 | ...")
    p.add_argument("--backend", help="host-async roles: threads | virtual (= --deterministic) | "
                                     "ray (processes, docs/distributed.md)")
    for s in SWITCHES:
        p.add_argument("--" + s.replace("_", "-"), action="store_true", default=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="no persistent JAX compilation cache (default: $RECJAX_CACHE/jax, "
                        "~/.cache/recjax/jax; = --train.compile_cache=off)")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--help-config", action="store_true", help="list every config key and exit")
    return p


def _overrides(rest: list[str]) -> list[tuple[str, str]]:
    """``--a.b=v`` / ``--a.b v`` pairs; anything else is an error naming the token."""
    pairs, i = [], 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--") or "." not in tok.split("=", 1)[0]:
            raise ConfigError(f"unrecognised argument {tok!r}; flags are listed by --help, config "
                              "keys (--section.field=value) by --help-config")
        if "=" in tok:
            key, val = tok[2:].split("=", 1)
        elif i + 1 < len(rest):
            key, val = tok[2:], rest[i + 1]
            i += 1
        else:
            raise ConfigError(f"{tok} needs a value: {tok}=VALUE")
        pairs.append((key, val))
        i += 1
    return pairs


def resolve(args: argparse.Namespace, rest: list[str]) -> Config:
    """Named config, then the fixed flags, then --section.field overrides (last wins)."""
    cfg = config_files.load(args.config)
    pairs = []
    for flag, key in FLAGS.items():
        v = getattr(args, flag)
        if v is not None:
            pairs.append((key, str(v)))
    for flag, key in SWITCHES.items():
        if getattr(args, flag):
            pairs.append((key, "true"))
    if args.no_progress:
        pairs.append(("train.progress", "false"))
    if args.no_compile_cache:
        pairs.append(("train.compile_cache", "off"))
    name = synthetic_name(args.data) if args.data else None
    if name is not None:  # the spec picks the preset; --synthetic.* overrides apply on top
        cfg = dataclasses.replace(cfg, synthetic=preset(name))
    return apply_overrides(cfg, pairs + _overrides(rest))


def parse(argv: list[str] | None, description: str) -> tuple[Config, argparse.Namespace]:
    p = parser(description)
    args, rest = p.parse_known_args(argv)
    try:
        cfg = resolve(args, rest)
    except (ConfigError, ValueError) as e:
        p.error(str(e))
    if args.help_config:
        print(help_text(cfg))
        raise SystemExit(0)
    return cfg, args
