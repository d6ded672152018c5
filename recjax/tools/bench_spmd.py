"""Throughput of the SPMD algorithms vs the single-device trainer at equal global batch.

    python scripts/bench_spmd.py [--repeats 5] [--quick]

Each configuration runs as its own `scripts/train.py` process (fake CPU devices must be set up
before JAX starts), ``repeats`` times; the row reports the median examples/sec over the timed
steps (summary.json's ``examples_per_sec``, which excludes the first, compiling step). On a
2-core host 8 fake devices share the cores, so the ratios measure SPMD overhead, not speedup
(PERF_NOTES item 7). `bench_spmd` is what scripts/bench.py calls.

Two single-device baselines: the trainer's default (``train.microbatches`` auto: 512-row
slices on XLA:CPU, 8 at B=4096) and one pass (``--train.microbatches=1``). Each of 8 fake
devices runs its 512 rows in one pass, so the one-pass baseline is the same computation
schedule and its ratio is the SPMD overhead; the ratio to the default also carries the cache
benefit of slicing, which 8 fake devices working concurrently on 2 cores do not get.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from recjax.tools.launch import launch

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: runs scripts/train.py

MODEL = ["--model", "deepfm", "--data", "synthetic:criteo_teacher", "--model.embed_dim=16",
         "--model.deep_mlp=256,128", "--batch-size", "4096", "--synthetic.n_eval=4096",
         "--sparse.name=sgd", "--dense.name=sgd", "--no-progress"]
CONFIGS = [  # name, train.py args, processes
    ("single", ["--algo", "single"], 1),
    ("single_one_pass", ["--algo", "single", "--train.microbatches=1"], 1),
    ("sync_8dev", ["--algo", "sync", "--devices", "8"], 1),
    ("sync_8dev_masked", ["--algo", "sync", "--devices", "8", "--spmd.route_capacity=0"], 1),
    ("sync_8dev_data4_model2", ["--algo", "sync", "--devices", "8", "--mesh", "data=4,model=2"], 1),
    ("des_8dev", ["--algo", "des", "--devices", "8"], 1),
    ("des_1proc_2dev", ["--algo", "des", "--devices", "2"], 1),
    ("des_2proc", ["--algo", "des"], 2),
]


def _once(args: list[str], procs: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(ROOT / "scripts/train.py"), *MODEL, "--steps", str(steps),
               "--out", out, *args]
        # fake CPU devices, also on a GPU host (where the default backend has 1 device)
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
        if procs == 1:
            subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True)
        elif launch(cmd, procs, quiet=True) != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed")
        return json.loads(pathlib.Path(out, "summary.json").read_text())["examples_per_sec"]


def bench_spmd(repeats: int = 5, quick: bool = False) -> list[dict]:
    """Rows ``{name, examples_per_sec, ratio_to_single, repeats, median, samples}``."""
    steps = 12 if quick else 40
    rows = []
    for name, args, procs in CONFIGS:
        samples = [_once(args, procs, steps) for _ in range(repeats)]
        med = statistics.median(samples)
        rows.append({"name": name, "examples_per_sec": med, "repeats": repeats, "median": med,
                     "samples": samples})
    single, one_pass = rows[0]["median"], rows[1]["median"]
    for r in rows:
        r["ratio_to_single"] = r["median"] / single
        r["ratio_to_single_one_pass"] = r["median"] / one_pass
    return rows


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    rows = bench_spmd(a.repeats, a.quick)
    for r in rows:
        print(f"{r['name']:>24}  {r['examples_per_sec']:>10,.0f} ex/s  x{r['ratio_to_single']:.2f} "
              f"of single  x{r['ratio_to_single_one_pass']:.2f} of single one-pass")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
