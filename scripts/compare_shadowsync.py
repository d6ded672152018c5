"""The ShadowSync study (Zheng et al., arXiv 2003.03477): Table 2 and Fig. 5 analogues, with seeds.

    python scripts/compare.py shadowsync [--seeds 0,1,2] [--quick | --smoke] [--out DIR]
        [--data DIR] [--doc docs/shadowsync.md] [--from-json DIR/results.json]
        [--compare-with OTHER/results.json]

S-EASGD vs FR-EASGD (k = 5, 10, 30, 100), S-MA vs FR-MA, S-BMUF vs FR-BMUF on synthetic data and
on Frappe, every cell once per seed, in deterministic virtual-clock mode; and EPS vs trainers
(1..16) for S-EASGD, FR-EASGD k = 5 and 30 and no sync. Writes OUT/results.json,
OUT/shadowsync.md and OUT/shadowsync_scaling.{png,svg} (OUT defaults to runs/compare_shadowsync);
only ``--doc PATH`` writes a tracked doc (the markdown to PATH, the figure next to it).
Frappe is ``frappe/frappe.train.libfm`` under ``--data`` (default $RECJAX_DATA, else
../shared/data next to the checkout). Verdict rules: scripts/shadowsync_verdicts.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from recjax import configs  # noqa: E402
from recjax.config import DataConfig  # noqa: E402
from recjax.data.synthetic import PRESETS  # noqa: E402
from recjax.models.config import ModelConfig  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
FRAPPE = "frappe/frappe.train.libfm"  # under --data / $RECJAX_DATA / ../shared/data
N, M, B = 4, 2, 128  # trainers, workers per trainer, batch per worker
KS = (5, 10, 30, 100)  # Table 2's sync gaps
VARIANTS = [("S-EASGD", "shadow", "easgd", None)] + [
    (f"FR-EASGD k={k}", "fr", "easgd", k) for k in KS] + [
    ("S-MA", "shadow", "ma", None), ("FR-MA k=10", "fr", "ma", 10),
    ("S-BMUF", "shadow", "bmuf", None), ("FR-BMUF k=10", "fr", "bmuf", 10)]
SCALE_VARIANTS = [("S-EASGD", "shadow", "easgd", None), ("FR-EASGD k=5", "fr", "easgd", 5),
                  ("FR-EASGD k=30", "fr", "easgd", 30), ("no sync", "shadow", "none", None)]
EXCHANGE_ITERS = 2.0  # the sync link is sized so one EASGD exchange takes 2 iterations' compute
# size -> (synthetic examples, Frappe epochs, trainer counts, scaling steps per trainer).
# Scaling runs last 10 syncs of FR-EASGD-30 (300 iterations) at full size: with 40, each trainer
# synced once, all at the same virtual moment, and FR-30's EPS measured that start-up burst
# (the last of n trainers waits 2(n-1) iterations for the link: 40 / (42 + 2(n-1)) efficiency).
SIZES = {"smoke": (4 * 1024, 0, (1, 2), 8), "quick": (64 * 1024, 1, (1, 2, 4, 8), 120),
         "full": (256 * 1024, 3, (1, 2, 4, 8, 16), 300)}


def base_config(dataset: str, size: str, frappe: str, seed: int):
    """DLRM on the default synthetic task, or DeepFM on Frappe (recjax/configs.py sizes)."""
    n_syn, frappe_epochs, _, _ = SIZES[size]
    if dataset == "synthetic":
        c = configs.default()
        c = dataclasses.replace(c, synthetic=dataclasses.replace(
            PRESETS["default"], n_train=n_syn, n_eval=20_000 if size != "smoke" else 2048))
        epochs = 1
    else:
        c = configs.frappe()  # DeepFM, not the config's FM: FM's dense part is one bias
        c = dataclasses.replace(c, data=DataConfig(train=f"frappe:{frappe}"),
                                model=ModelConfig(name="deepfm", embed_dim=16, deep_mlp=(64, 32)))
        epochs = frappe_epochs
    return dataclasses.replace(c, train=dataclasses.replace(
        c.train, batch_size=B, epochs=epochs, steps=0, progress=False, deterministic=True,
        eval_batch_size=8192, seed=seed))


def variant(c, algo, sync, k, **runtime):
    rt = dataclasses.replace(c.runtime, trainers=N, workers_per_trainer=M, **runtime)
    sc = dataclasses.replace(c.shadowsync, sync=sync, sync_gap=k or 1, alpha=0.5, bmuf_lr=1.0,
                             bmuf_momentum=0.5)
    return dataclasses.replace(c, runtime=rt, shadowsync=sc,
                               train=dataclasses.replace(c.train, algo=algo))


def convergence(dataset: str, size: str, frappe: str, seed: int) -> dict[str, dict]:
    """One seed of Table 2's analogue: variant name -> its summary's numbers."""
    from algorithms import shadowsync

    c = base_config(dataset, size, frappe, seed)
    rows = {}
    for name, algo, sync, k in VARIANTS:
        t = time.perf_counter()
        s = shadowsync.run(variant(c, algo, sync, k))
        rows[name] = {"train_ne": s["train_ne"], "eval_ne": s["eval_ne"],
                      "eval_auc": s["eval_auc"], "gap": s["avg_sync_gap"], "steps": s["steps"],
                      "secs": time.perf_counter() - t}
        print(f"  seed {seed} {dataset:<9} {name:<15} train NE {s['train_ne']:.4f}  eval NE "
              f"{s['eval_ne']:.4f}  gap {s['avg_sync_gap'] or float('nan'):.2f}  "
              f"({rows[name]['secs']:.0f}s)", flush=True)
    return rows


def scaling(size: str, seed: int) -> dict:
    """EPS (examples per virtual second) vs trainers, 1 worker each, 8 fast embedding links.

    The sync PS link is sized so that one EASGD exchange (2 x dense bytes) takes as long as
    EXCHANGE_ITERS iterations' compute: the FR cap is chosen here (shadowsync_verdicts.fr_cap).
    """
    from algorithms import shadowsync

    _, _, ns, steps = SIZES[size]
    c = base_config("synthetic", "quick" if size != "smoke" else "smoke", "", seed)
    out: dict = {"trainers": list(ns), "eps": {}, "gap": {}, "exchange_iters": EXCHANGE_ITERS}
    for name, algo, sync, k in SCALE_VARIANTS:
        for n in ns:
            v = variant(c, algo, sync, k, ps_shards=8, bandwidth_gbps=1000.0)
            v = dataclasses.replace(v, runtime=dataclasses.replace(v.runtime, trainers=n,
                                                                   workers_per_trainer=1))
            v = dataclasses.replace(v, train=dataclasses.replace(v.train, steps=steps * n))
            p_bytes = 4 * 2 * _dense_params(v)
            t_iter = v.runtime.example_cost_us * 1e-6 * B
            gbps = p_bytes / (EXCHANGE_ITERS * t_iter) * 8 / 1e9
            v = dataclasses.replace(v, runtime=dataclasses.replace(v.runtime,
                                                                   sync_bandwidth_gbps=gbps))
            s = shadowsync.run(v)
            out["eps"].setdefault(name, []).append(s["examples_per_sec"])
            out["gap"].setdefault(name, []).append(s["avg_sync_gap"])
            out["sync_gbps"] = gbps
            print(f"  scaling {name:<13} n={n:<3} {s['examples_per_sec']:,.0f} ex/virtual s",
                  flush=True)
    return out


def _dense_params(cfg) -> int:
    import jax

    from recjax.train.data import open_data
    from recjax.train.setup import build
    return sum(int(x.size) for x in jax.tree.leaves(build(cfg, open_data(cfg).spec)[3].params))


def _commit() -> str:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                           capture_output=True, text=True, check=True)
        return r.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_study(seeds: list[int], size: str, frappe: str | None, out: pathlib.Path,
              command: str) -> dict:
    """The scaling sweep once (it does not depend on the seed: virtual-clock EPS is a function
    of the schedule, not of the values), then every cell for every seed; OUT/results.json is
    rewritten after each part, so a stopped study keeps what it measured."""
    t0 = time.perf_counter()
    res: dict = {"seeds": seeds, "size": size, "commit": _commit(), "command": command,
                 "datasets": {}, "partial": True}
    out.mkdir(parents=True, exist_ok=True)

    def save():
        res["wall_seconds"] = time.perf_counter() - t0
        (out / "results.json").write_text(json.dumps(res, indent=1))

    res["scaling"] = scaling(size, seeds[0])
    res["scaling"]["seed"] = seeds[0]
    save()
    for ds in ["synthetic"] + (["frappe"] if frappe else []):
        res["datasets"][ds] = {}
        for s in seeds:
            res["datasets"][ds][str(s)] = convergence(ds, size, frappe or "", s)
            save()
    res["partial"] = False
    save()
    return res


def _enable_compile_cache(directory: pathlib.Path) -> None:
    """Each of the ~70 cells rebuilds the same jitted functions; jax's persistent cache turns
    those rebuilds into loads (the cells' results do not depend on it)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, or a count N "
                   "(seeds 0..N-1); at least 2, since verdicts need a noise estimate")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="64K synthetic examples, 1 Frappe "
                      "epoch, up to 8 trainers")
    size.add_argument("--smoke", action="store_true", help="tiny, synthetic only (tests)")
    p.add_argument("--out", default=str(ROOT / "runs" / "compare_shadowsync"), help="folder "
                   "for results.json, shadowsync.md, shadowsync_scaling.{png,svg}")
    p.add_argument("--data", help="data folder holding frappe/ (default $RECJAX_DATA, else "
                   "../shared/data next to the checkout)")
    p.add_argument("--frappe", default=FRAPPE, help="Frappe libfm file, relative to --data")
    p.add_argument("--no-frappe", action="store_true", help="synthetic only")
    p.add_argument("--doc", help="also write the markdown here (e.g. docs/shadowsync.md) and the "
                   "figure next to it")
    p.add_argument("--compile-cache", default=str(ROOT / "runs" / "jax_cache"),
                   help="jax persistent compilation cache folder ('' = none)")
    p.add_argument("--from-json", help="re-render from a results.json instead of running")
    p.add_argument("--compare-with", help="another run's results.json: list both runs' "
                   "verdicts and whether they agree")
    args = p.parse_args(argv)
    if args.from_json:
        res = json.loads(pathlib.Path(args.from_json).read_text())
        res["rendered_by"] = " ".join(["python scripts/compare.py shadowsync"] + argv)
    else:
        seeds = ([int(s) for s in args.seeds.split(",")] if "," in args.seeds
                 else list(range(int(args.seeds))))
        if len(seeds) < 2:
            p.error(f"--seeds {args.seeds}: at least 2 seeds (verdicts compare a difference "
                    "with its seed noise)")
        if args.data:
            os.environ["RECJAX_DATA"] = args.data
        frappe = None
        if not (args.smoke or args.no_frappe):
            from recjax.data.sources import DataError, resolve_path
            try:
                frappe = resolve_path(args.frappe)
            except DataError as e:
                p.error(f"Frappe: {e} (pass --data DIR, set RECJAX_DATA, or --no-frappe)")
        if args.compile_cache:
            _enable_compile_cache(pathlib.Path(args.compile_cache))
        size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
        res = run_study(seeds, size_name, frappe, pathlib.Path(args.out),
                        " ".join(["python scripts/compare.py shadowsync"] + argv))
    from scripts import shadowsync_report

    other = json.loads(pathlib.Path(args.compare_with).read_text()) if args.compare_with else None
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shadowsync_report.write(out / "shadowsync.md", res, other)
    print(f"wrote {out}/" + ("" if args.from_json else "results.json, ")
          + f"shadowsync.md, shadowsync_scaling.{{png,svg}} ({res['wall_seconds']:.0f}s of study)")
    if args.doc:
        shadowsync_report.write(pathlib.Path(args.doc), res, other)
        print(f"wrote {args.doc} and the figure next to it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
