"""How fast the virtual clock simulates: wall examples/sec of GBA at 32 workers and ShadowSync
at 16 trainers against the single trainer on the same model (issue 35, "a fast virtual clock").

    python scripts/bench_clock.py [--repeats 5] [--quick] [--eager | --with-eager] [--json FILE]
    python scripts/bench_clock.py --split gba/gba [--quick]    # where one arm's time goes

Every arm trains the default config's DLRM on synthetic data with ``--deterministic`` (the
virtual clock) and is timed by its own metrics.jsonl: the wall time between its train records
at steps S and 2S of its 3S (`WINDOW`), so set-up, compiles, the end of the run (a host-async
run's last record is written after its eval) and the eval are left out of every arm alike.
The arms, each the issue's pilot setting:

* ``single``: ``--algo single``, global batch 1024 (the reference);
* ``gba/MODE``: 32 workers, local batch 32, M = 32 (global batch 1024), stragglers
  ``lognormal:sigma=0.5+slow:k=3,factor=8``, the mode knobs scaled to 32 workers (b2 = b3 =
  20% of them);
* ``shadow``: S-EASGD, 16 trainers x 1 worker, 64 rows each (16 x 64 = 1024 in flight), the
  same stragglers.

Repeats are interleaved (every arm, then again, seeded differently); each arm's ratio to single
is taken within a repeat and the median printed with the load average. The goal: >= 0.5.
`bench_clock(repeats, quick) -> list[dict]` is what scripts/bench.py can call.

``--split ARM`` runs one arm once and prints the CPU time (the process's, all threads: less
sensitive to the other jobs on a shared box than wall time) of each piece of the simulation
in the same window, per global step (`SPLIT`; the pieces nest, so they do not add up).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import statistics
import tempfile
import time

from recjax import configs
from recjax.data.synthetic import PRESETS

STRAGGLERS = "lognormal:sigma=0.5+slow:k=3,factor=8"
GLOBAL_BATCH = 1024
GBA_WORKERS, GBA_LOCAL = 32, 32
SHADOW_TRAINERS = 16
MODES = ("gba", "sync", "async", "hop_bs", "bsp", "hop_bw")
QUICK_MODES = ("gba", "sync")
WINDOW = {False: 30, True: 8}  # S: global steps between the two timed records (quick: 8)


def arm_config(arm: str, window: int, seed: int, out: str):
    """The config of `arm` (``single``, ``gba/MODE``, ``shadow``): 3 x `window` global steps
    of 1024 examples, a train record every `window` steps."""
    c = configs.default()
    shadow = arm == "shadow"
    batch = GLOBAL_BATCH // SHADOW_TRAINERS if shadow else GLOBAL_BATCH
    steps = 3 * window * (SHADOW_TRAINERS if shadow else 1)  # shadow: one step = one batch of 64
    algo = "gba" if arm.startswith("gba/") else arm
    scaled = max(1, round(0.2 * GBA_WORKERS))
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS["default"], n_train=(3 * window + 2) * GLOBAL_BATCH,
                                         n_eval=4096),
        train=dataclasses.replace(c.train, algo=algo, batch_size=batch, steps=steps, seed=seed,
                                  progress=False, deterministic=algo != "single", out=out,
                                  log_every=window * (SHADOW_TRAINERS if shadow else 1)),
        runtime=dataclasses.replace(c.runtime, stragglers=STRAGGLERS, trainers=SHADOW_TRAINERS,
                                    workers_per_trainer=1),
        gba=dataclasses.replace(c.gba, mode=arm.partition("/")[2] or "gba", workers=GBA_WORKERS,
                                local_batch_size=GBA_LOCAL, b2=scaled, b3=scaled))


def timed_rate(metrics: pathlib.Path, start: int, end: int) -> float:
    """Examples per wall second between the run's train records at steps `start` and `end`."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    at = {r["step"]: r for r in recs if r.get("kind") == "train"}
    if start not in at or end not in at:
        raise RuntimeError(f"{metrics}: train records at steps {sorted(at)}; {start} and {end} "
                           "are timed")
    a, b = at[start], at[end]
    return (b["examples"] - a["examples"]) / (b["wall"] - a["wall"])


def bench_clock(repeats: int = 5, quick: bool = False, eager: bool = False,
                with_eager: bool = False) -> list[dict]:
    """One row per arm: median wall examples/sec, median ratio to single, every repeat.

    Args:
      eager: the virtual clock runs each worker computation when it is made, one jitted call
        each, as before `batched.py` (what the batching buys).
      with_eager: every virtual-clock arm twice, batched and eager (``ARM eager``), interleaved
        in each repeat, so that the two are compared under the same load.
    """
    import algorithms
    from algorithms.runtime import batched

    arms = [*(f"gba/{m}" for m in (QUICK_MODES if quick else MODES)), "shadow"]
    if with_eager:
        arms = [a for arm in arms for a in (arm, f"{arm} eager")]
    arms = ["single", *arms]
    runs: dict[str, list[float]] = {a: [] for a in arms}
    loads = []
    try:
        for r in range(repeats):
            for arm in arms:
                batched.ENABLED = not (eager or arm.endswith(" eager"))
                with tempfile.TemporaryDirectory() as out:
                    cfg = arm_config(arm.removesuffix(" eager"), WINDOW[quick], r, out)
                    algorithms.run(cfg)
                    s = cfg.train.log_every
                    runs[arm].append(timed_rate(pathlib.Path(out) / "metrics.jsonl", s, 2 * s))
                loads.append(os.getloadavg()[0])
    finally:
        batched.ENABLED = True
    rows = []
    for arm, eps in runs.items():
        ratios = [a / b for a, b in zip(eps, runs["single"])]
        rows.append({"name": f"clock/{arm}", "arm": arm, "repeats": repeats,
                     "examples_per_sec_median": statistics.median(eps),
                     "ratio_to_single_median": statistics.median(ratios),
                     "examples_per_sec_all": eps, "ratios_all": ratios,
                     "load_average_median": statistics.median(loads),
                     "stragglers": STRAGGLERS, "global_batch": GLOBAL_BATCH})
    return rows


# the pieces `split` times: (module, class or "", function), in the order printed
SPLIT = (("algorithms.runtime.batched", "Batcher", "force"),
         ("algorithms.runtime.batched", "", "_stacked"),
         ("algorithms.gba", "GbaServer", "_apply"),
         ("algorithms.gba", "GbaServer", "_apply_rows"),
         ("algorithms.runtime.ps", "EmbeddingShard", "push"),
         ("algorithms.runtime.worker", "Worker", "take"),
         ("algorithms.runtime.worker", "Worker", "compute"),
         ("algorithms.runtime.stragglers", "StragglerModel", "factor"),
         ("algorithms.runtime.worker", "Replica", "apply"),
         ("algorithms.runtime.ps", "EmbeddingShard", "exchange"))


def split(arm: str, quick: bool = False) -> dict[str, float]:
    """CPU ms per global step of each `SPLIT` piece (``window``: all of it) in `arm`'s timed
    window, from one run of it."""
    import algorithms
    from recjax.train import hooks

    window = WINDOW[quick]
    spent: collections.Counter = collections.Counter()
    state = {"on": False, "records": 0, "t0": 0.0}

    def timed(f, label):
        def g(*a, **k):
            if not state["on"]:
                return f(*a, **k)
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.process_time() - t
        return g

    def record(f):
        def g(*a, **k):  # the window: from the first train record to the second
            if state["records"] == 1:
                state["on"] = False
                spent["window"] = time.process_time() - state["t0"]
            out = f(*a, **k)
            state["records"] += 1
            if state["records"] == 1:
                state["on"], state["t0"] = True, time.process_time()
            return out
        return g

    with contextlib.ExitStack() as undo:
        targets = [(hooks, "RunOutputs", "train_record", record)]
        for mod, cls, fn in SPLIT:
            m = importlib.import_module(mod)
            owner = getattr(m, cls) if cls else m
            if hasattr(owner, fn):
                targets.append((m, cls, fn, lambda f, label=f"{cls or mod}.{fn}": timed(f, label)))
        for m, cls, fn, wrap in targets:
            owner = getattr(m, cls) if cls else m
            orig = owner.__dict__[fn] if cls else getattr(m, fn)
            setattr(owner, fn, wrap(orig))
            undo.callback(setattr, owner, fn, orig)
        with tempfile.TemporaryDirectory() as out:
            algorithms.run(arm_config(arm, window, 0, out))
    return {k: 1000 * v / window for k, v in spent.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--eager", action="store_true",
                   help="worker computations one call each, as before batched.py")
    p.add_argument("--with-eager", action="store_true",
                   help="also every virtual-clock arm without batching, interleaved")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--split", metavar="ARM",
                   help="instead: CPU ms per global step of each piece of ARM (gba/gba, shadow)")
    args = p.parse_args(argv)
    if args.split:
        pieces = split(args.split, args.quick)
        print(f"{args.split}: CPU ms per global step of 1024 examples, load average "
              f"{os.getloadavg()[0]:.1f}")
        for k, v in sorted(pieces.items(), key=lambda kv: -kv[1]):
            print(f"  {k:<40}{v:8.2f}")
        return 0
    rows = bench_clock(args.repeats, args.quick, args.eager, args.with_eager)
    print(f"virtual clock ({'eager' if args.eager else 'batched'}) vs single, global batch "
          f"{GLOBAL_BATCH}, stragglers {STRAGGLERS}, median of {args.repeats} interleaved "
          "repeats, load average "
          f"{rows[0]['load_average_median']:.1f} ({os.cpu_count()} cores)")
    print(f"{'arm':<20}{'wall ex/s':>12}{'/ single':>10}   goal >= 0.5")
    for r in rows:
        print(f"{r['arm']:<20}{r['examples_per_sec_median']:>12,.0f}"
              f"{r['ratio_to_single_median']:>10.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
