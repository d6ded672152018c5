"""A study's segments with the synthetic memo on and off: what `recjax.data.memo` saves.

    python scripts/bench_study.py [--repeats 5] [--quick] [--json FILE]

A study (`scripts/compare.py`) runs its segments one after another in one process, each a run
that opens its data afresh. Here one process runs what a study runs for one seed and two arms
of the GBA study file (``scripts/studies/gba.py``): ``gba`` and ``async``, each its chunks
from a copy of the seed's base checkpoint, at the full size (32 workers, 1M eval rows; base
run once, before the timing) or, with ``--quick``, the quick size. Each repeat runs two such
processes, the memo on (``RECJAX_SYNTHETIC_CACHE_MB`` 512) and off (0), in alternating order;
the table gives each one's seconds per segment (medians over the repeats) and the median of
the per-repeat ratios on / off. The two processes must score every segment alike to the last
bit (the memo keeps values, it never changes one): the benchmark checks it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUDY = ROOT / "scripts" / "studies" / "gba.py"
ARMS = ("gba", "async")


def _setup(size_name: str):
    from recjax.study import load, runner

    study = load(str(STUDY))
    size = study.sizes[size_name].for_dataset("synthetic")
    return study, size, runner.dataset_overrides(study, "synthetic")


def child(size_name: str, base: str, out: str) -> dict:
    """The segments in this process: per arm a copy of `base`, then its chunks in order."""
    import algorithms
    from recjax import compile_cache
    from recjax.study import runner

    study, size, data = _setup(size_name)
    compile_cache.enable("auto")
    rows = []
    for arm in ARMS:
        d = os.path.join(out, arm)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        for j in range(1, size.chunks + 1):
            cfg = runner.segment_config(study, size, data, study.arm(arm), 0, d,
                                        size.base + j * size.chunk, True, "synthetic")
            t = time.perf_counter()
            s = algorithms.run(cfg)
            rows.append({"arm": arm, "chunk": j, "secs": time.perf_counter() - t,
                         "eval_auc": s["eval_auc"], "eval_logloss": s["eval_logloss"]})
    return {"rows": rows, "load": os.getloadavg()}


def _base(size_name: str, out: str) -> None:
    """The seed's base run (the study's reference arm, `size.base` steps) into `out`."""
    import algorithms
    from recjax.study import runner

    study, size, data = _setup(size_name)
    algorithms.run(runner.segment_config(study, size, data, study.base_arm, 0, out, size.base,
                                         False, "synthetic"))


def _spawn(size_name: str, base: str, out: str, memo_mb: int) -> dict:
    env = {**os.environ, "RECJAX_SYNTHETIC_CACHE_MB": str(memo_mb)}
    res = subprocess.run([sys.executable, "-m", "algorithms.tools.bench_study", "--child",
                          size_name, base, out], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"the benchmark's child failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def bench_study(repeats: int, quick: bool, log=print) -> dict:
    size_name = "quick" if quick else "full"
    with tempfile.TemporaryDirectory(prefix="bench_study_") as tmp:
        base = os.path.join(tmp, "base")
        _base(size_name, base)
        runs = {"on": [], "off": []}
        for r in range(repeats):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for v in order:
                runs[v].append(_spawn(size_name, base, os.path.join(tmp, v),
                                      512 if v == "on" else 0))
                log(f"repeat {r + 1} memo {v}: {sum(x['secs'] for x in runs[v][-1]['rows']):.1f} s"
                    f" ({len(runs[v][-1]['rows'])} segments, load {runs[v][-1]['load'][0]:.2f})")
    for a, b in zip(runs["on"], runs["off"]):
        scores = [[(x["arm"], x["chunk"], x["eval_auc"], x["eval_logloss"]) for x in run["rows"]]
                  for run in (a, b)]
        if scores[0] != scores[1]:
            raise AssertionError(f"the memo changed a segment's scores: {scores}")

    def per_segment(run: dict, arm: str | None = None) -> float:
        xs = [x["secs"] for x in run["rows"] if arm is None or x["arm"] == arm]
        return sum(xs) / len(xs)

    out = {"size": size_name, "repeats": repeats, "segments": len(runs["on"][0]["rows"])}
    for arm in (None, *ARMS):
        key = arm or "all"
        on = [per_segment(x, arm) for x in runs["on"]]
        off = [per_segment(x, arm) for x in runs["off"]]
        out[key] = {"on_s": statistics.median(on), "off_s": statistics.median(off),
                    "ratio": statistics.median(a / b for a, b in zip(on, off))}
    out["load"] = [x["load"][0] for v in runs.values() for x in v]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(*argv[1:4])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="the study's quick size")
    p.add_argument("--json", help="also write the result to this file")
    args = p.parse_args(argv)
    out = bench_study(args.repeats, args.quick)
    print(f"GBA study, {out['size']} size, seed 0, {out['segments']} segments a process, median "
          f"of {args.repeats}")
    print(f"{'segments':<10}{'memo on, s':>12}{'memo off, s':>13}{'on / off':>10}")
    for key in ("all", *ARMS):
        r = out[key]
        print(f"{key:<10}{r['on_s']:>12.2f}{r['off_s']:>13.2f}{r['ratio']:>10.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
