"""GBA and its five baselines under stragglers: global QPS of all six modes in one run.

    python scripts/bench_gba.py [--repeats 5] [--quick] [--json FILE]

The same PS, data list and N_a = 4 workers (DLRM of the default config, global batch 512 =
M x B_a with B_a = 128, M = 4) for every mode of ``--gba.mode``, with one worker 4x slower
(``slow:k=1,factor=4``: in threads it sleeps 3x its measured compute, so the 2-core box
measures the schedule honestly) on both interpreters: threads (wall clock) and the virtual
clock (modelled compute of ``runtime.example_cost_us`` per example). Repeats are interleaved
(mode after mode, then again) and seeded differently; the table shows the medians and each
mode's median ratio to Sync and to Async within the same repeat (the paper's Table 5.2:
GBA 2.0-2.3x Sync and 0.97-1.0x Async). `bench_gba(repeats, quick) -> list[dict]` is what
scripts/bench.py calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics

from recjax import configs
from recjax.data.synthetic import PRESETS

MODES = ("sync", "async", "hop_bs", "bsp", "hop_bw", "gba")
STRAGGLERS = "slow:k=1,factor=4"
KNOBS = dict(iota=3, b1=2, b2=4, b3=1)  # Table 5.1's knobs scaled to 4 workers


def bench_config(mode: str, clock: str, quick: bool, seed: int = 0):
    c = configs.default()
    steps = 30 if quick else 60
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS["default"], n_train=steps * 512, n_eval=4096),
        train=dataclasses.replace(c.train, algo="gba", batch_size=512, steps=steps, seed=seed,
                                  progress=False, deterministic=clock == "virtual"),
        runtime=dataclasses.replace(c.runtime, stragglers=STRAGGLERS),
        gba=dataclasses.replace(c.gba, mode=mode, workers=4, local_batch_size=128, **KNOBS))


def bench_gba(repeats: int = 5, quick: bool = False) -> list[dict]:
    """One row per (clock, mode): median global QPS, its median ratios to Sync and Async."""
    import algorithms

    rows = []
    for clock in ("threads", "virtual"):
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        for r in range(repeats):
            for mode in MODES:
                s = algorithms.run(bench_config(mode, clock, quick, seed=r))
                runs[mode].append({"qps": s["global_qps"], "dropped": s["dropped_gradients"],
                                   "staleness": s["dense_staleness"]["mean"]})
        for mode, xs in runs.items():
            qps = [x["qps"] for x in xs]
            vs = {b: statistics.median(a / y["qps"] for a, y in zip(qps, runs[b]))
                  for b in ("sync", "async")}
            rows.append({"name": f"gba/{clock}/{mode}", "clock": clock, "mode": mode,
                         "repeats": repeats, "examples_per_sec_median": statistics.median(qps),
                         "ratio_to_sync_median": vs["sync"], "ratio_to_async_median": vs["async"],
                         "dropped_median": statistics.median(x["dropped"] for x in xs),
                         "dense_staleness_mean_median": statistics.median(
                             x["staleness"] or 0.0 for x in xs),
                         "examples_per_sec_all": qps, "stragglers": STRAGGLERS, "workers": 4,
                         "global_batch": 512, "local_batch": 128})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    rows = bench_gba(args.repeats, args.quick)
    print(f"stragglers {STRAGGLERS}, 4 workers, B_a 128, M 4, median of {args.repeats}")
    print(f"{'clock':<9}{'mode':<8}{'global QPS':>12}{'/ Sync':>9}{'/ Async':>9}{'dropped':>9}"
          f"{'staleness':>11}")
    for r in rows:
        print(f"{r['clock']:<9}{r['mode']:<8}{r['examples_per_sec_median']:>12,.0f}"
              f"{r['ratio_to_sync_median']:>9.2f}{r['ratio_to_async_median']:>9.2f}"
              f"{r['dropped_median']:>9.0f}{r['dense_staleness_mean_median']:>11.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
