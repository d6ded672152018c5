"""Persia study (Lian et al., KDD 2022): Table 2, Sec. 6.3 and Theorem 1 analogues.

    python scripts/compare.py persia [--quick] [--out runs/compare_persia] [--seeds N]
                                     [--datasets synthetic,criteo,avazu,taobao] [--write-docs]

(a) Table 2: eval AUC and NE of ``--persia.mode`` hybrid, sync and async on the synthetic
teacher task (DLRM) and on the real Criteo, Avazu and Taobao samples (DeepFM), one run per mode
and seed, every mode on the same data order and eval rows; the seeds give the spread. (b) Sec.
6.3: the throughput of each of those runs (the virtual clock's examples per modelled second:
the runs are deterministic, so the study is bit-reproducible; `scripts/bench_persia.py`
measures threads). (c) Theorem 1, Eq. 6: eval AUC against the staleness bound tau (hybrid, more
embedding workers so that a large tau is reached; the realised ``embedding_staleness.max`` is
reported next to each tau) and the data's alpha (the largest fraction of samples that share one
id). (d) Dynamic ids (Sec. 4.2.2): the Criteo sample with ``--embed.store lru`` and a capacity
below its distinct ids per field, evictions counted, next to the fixed-table run.

Settings: 2 NN workers, 4 embedding workers (8 in the tau sweep), tau = 4 ("less than 5 for most
cases", Sec. 5), embedding stragglers ``slow:k=1,factor=4``, deterministic virtual clock. Writes
OUT/persia_study.{json,md} and OUT/persia_study.{svg,png}; ``--write-docs`` also rewrites the
generated part of docs/persia.md and docs/persia_study.{svg,png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("hybrid", "sync", "async")
NN, EMB, TAU, TAU_EMB = 2, 4, 4, 8
TAUS, QUICK_TAUS = (0, 1, 2, 4, 8, 16), (0, 1, 4, 16)
STRAGGLERS = "slow:k=1,factor=4"
# dataset -> (reader kind, train file, eval file) under $RECJAX_DATA (default ../shared/data)
REAL = {"criteo": ("criteo", "criteo_kaggle_8k/train.tsv", "criteo_kaggle_8k/valid.tsv"),
        "avazu": ("avazu", "avazu_9k/train.csv", "avazu_9k/valid.csv"),
        "taobao": ("taobao", "taobao_ad_tiny/train_sample.csv", "taobao_ad_tiny/valid_sample.csv")}
SIZES = ("smoke", "quick", "full")
SPARSE_LR = 0.01  # the real samples' Adagrad lr (configs.criteo's); 0.05 is in docs/persia.md
SEEDS = {"smoke": 1, "quick": 2, "full": 5}
PAR = 0.001  # Table 2: "the test AUC gap between the hybrid mode and synchronous mode is always
#             less than 0.1%" (percentage points of AUC: 65.86% vs 65.93%, ... = 0.001)
FASTER = 1.5  # "much faster" scored as hybrid >= 1.5x sync (the issue's acceptance target)
NEAR = 0.8  # hybrid >= 0.8x async (the issue's target; the paper: async 1.2x hybrid, Fig. 9)


def base_config(dataset: str, size: str, paths: tuple[str, str] = ("", ""),
                sparse_lr: float = SPARSE_LR):
    """The study's config of `dataset` at `size` (before mode, seed and tau); `sparse_lr` is the
    real samples' Adagrad learning rate."""
    from recjax import configs
    from recjax.config import DataConfig, DenseOptimConfig
    from recjax.embeddings import SparseOptimConfig
    from recjax.models.config import ModelConfig

    if dataset == "synthetic":
        c = configs.smoke() if size == "smoke" else configs.default()  # DLRM, Adam, Adagrad
        batch = 64 if size == "smoke" else 256
        n = {"smoke": 24 * 64, "quick": 300 * 256, "full": 1000 * 256}[size]
        c = dataclasses.replace(c, synthetic=dataclasses.replace(
            c.synthetic, n_train=n, n_eval={"smoke": 2048, "quick": 20_000}.get(size, 50_000)))
        epochs = 1
    else:
        kind = REAL[dataset][0]
        # the paper's model is an MLP on the embeddings; DeepFM is that plus the FM term
        c = configs.criteo()
        c = dataclasses.replace(
            c, data=DataConfig(train=f"{kind}:{paths[0]}", eval=f"{kind}:{paths[1]}",
                               hash_buckets=1 << 15, multi_hot_len=8),
            model=ModelConfig(name="deepfm", embed_dim=8, deep_mlp=(64, 32)),
            dense=DenseOptimConfig(name="adam", lr=1e-3),
            sparse=SparseOptimConfig(name="adagrad", lr=sparse_lr))
        batch = 32 if dataset == "taobao" else 128
        epochs = 10 if dataset == "taobao" else 1
    return dataclasses.replace(
        c, train=dataclasses.replace(c.train, algo="persia", batch_size=batch, epochs=epochs,
                                     steps=0, progress=False, deterministic=True,
                                     eval_batch_size=8192, log_every=10_000),
        persia=dataclasses.replace(c.persia, nn_workers=NN, embedding_workers=EMB, staleness=TAU,
                                   embedding_stragglers=STRAGGLERS))


def arm(c, mode: str, seed: int, **persia):
    return dataclasses.replace(c, train=dataclasses.replace(c.train, seed=seed),
                               persia=dataclasses.replace(c.persia, mode=mode, **persia))


def run_arm(cfg) -> dict:
    """One run; the numbers the study keeps from its summary."""
    from algorithms import persia

    t = time.perf_counter()
    s = persia.run(cfg)
    row = {"seed": cfg.train.seed, "eval_auc": s["eval_auc"], "eval_ne": s["eval_ne"],
           "steps": s["steps"], "examples_per_sec": s["examples_per_sec"],
           "staleness_mean": s["embedding_staleness"]["mean"],
           "staleness_max": s["embedding_staleness"]["max"],
           "dense_staleness_mean": (s.get("dense_staleness") or {}).get("mean"),
           "eval_examples": s["eval_examples"], "eval_ctr": s["eval_ctr"]}
    if "lru" in s:
        row["lru"] = s["lru"]["total"]
    row["secs"] = time.perf_counter() - t
    return row


def id_alpha(cfg) -> dict:
    """Theorem 1's alpha on the training data: the largest fraction of samples containing one
    id (per table), with the field it is in and how many distinct ids each field has."""
    import numpy as np

    from recjax.train.data import open_data

    data = open_data(cfg)
    counts: dict[int, dict[int, int]] = {}
    n = 0
    for ch in data.train.chunks():
        keep = np.ones(len(ch.label), bool) if data.keep_train is None else data.keep_train(ch.row)
        ids = ch.ids[keep]
        mask = None if ch.mask is None else ch.mask[keep] > 0
        n += len(ids)
        for f in range(ids.shape[1]):
            col = ids[:, f, :]
            rows = np.repeat(np.arange(len(col)), col.shape[1])
            pairs = np.stack([rows, col.ravel()], 1)
            if mask is not None:
                pairs = pairs[mask[:, f, :].ravel()]
            u, c = np.unique(np.unique(pairs, axis=0)[:, 1], return_counts=True)
            d = counts.setdefault(f, {})
            for i, k in zip(u.tolist(), c.tolist()):
                d[i] = d.get(i, 0) + k
    best = max(((max(d.values()) / n, f) for f, d in counts.items() if d), default=(0.0, -1))
    return {"alpha": best[0], "field": data.train.spec.fields[best[1]].name if best[1] >= 0 else None,
            "samples": n, "distinct_ids_per_field": [len(counts.get(f, {}))
                                                     for f in range(len(data.train.spec.fields))]}


def _fields(row: dict) -> str:
    return (f"AUC {row['eval_auc']:.4f} NE {row['eval_ne']:.4f} {row['examples_per_sec']:,.0f} ex/vs "
            f"staleness {row['staleness_mean']:.2f} (max {row['staleness_max']}) "
            f"({row['secs']:.1f}s)")


def table2(c, seeds: int, log=print) -> dict[str, list[dict]]:
    """Every mode on every seed; seeds interleaved so that a cut-short run is still paired."""
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for seed in range(seeds):
        for mode in MODES:
            runs[mode].append(run_arm(arm(c, mode, seed)))
            log(f"  {mode:<7} seed {seed}: {_fields(runs[mode][-1])}")
    return runs


def tau_sweep(c, taus, seeds: int, log=print) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for seed in range(seeds):
        for tau in taus:
            r = run_arm(arm(c, "hybrid", seed, staleness=tau, embedding_workers=TAU_EMB))
            out.setdefault(str(tau), []).append(r)
            log(f"  tau {tau:<3} seed {seed}: {_fields(r)}")
    return out


def lru_study(c, alpha: dict, log=print) -> dict:
    """Criteo, hybrid, seed 0, with an LRU store of half the largest field's distinct ids, and
    with one large enough to hold every id (no eviction: what hashing alone changes)."""
    per_field = alpha["distinct_ids_per_field"]
    out = {"capacity": max(8, max(per_field) // 2), "roomy_capacity": 2 * max(per_field)}
    out["fields_over_capacity"] = sum(n > out["capacity"] for n in per_field)
    out["fields"], out["max_distinct_ids_per_field"] = len(per_field), max(per_field)
    cfg = arm(c, "hybrid", 0)
    for key, cap in (("lru", out["capacity"]), ("lru_roomy", out["roomy_capacity"])):
        try:
            r = run_arm(dataclasses.replace(cfg, embed=dataclasses.replace(
                cfg.embed, store="lru", capacity=cap)))
        except Exception as e:  # noqa: BLE001 - the LRU store may not run yet: say why, go on
            out["skipped"] = f"--embed.store lru did not run: {type(e).__name__}: {e}"
        else:
            if "lru" not in r:
                out["skipped"] = "--embed.store lru ran but its summary has no 'lru' counters"
        if "skipped" in out:
            log(f"  skipping the dynamic-id runs: {out['skipped']}")
            return out
        out[key] = r
        log(f"  lru capacity {cap}: {_fields(r)}, evicted {r['lru'].get('evicted')}")
    return out


# -- scoring ------------------------------------------------------------------------------------
def stats(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    return {"mean": statistics.fmean(xs) if xs else math.nan,
            "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs, default=math.nan), "max": max(xs, default=math.nan), "n": len(xs)}


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def ci95(xs: list[float]) -> tuple[float, float]:
    """Student-t 95% interval of the mean of `xs` (paired differences over seeds)."""
    s = stats(xs)
    if s["n"] < 2:
        return s["mean"], s["mean"]
    half = T95.get(s["n"] - 1, 1.96) * s["sd"] / math.sqrt(s["n"])
    return s["mean"] - half, s["mean"] + half


def paired(runs: dict[str, list[dict]], a: str, b: str, key: str = "eval_auc") -> list[float]:
    """Per seed: runs[a] - runs[b] (the same seed's data order and eval rows)."""
    return [x[key] - y[key] for x, y in zip(runs[a], runs[b])]


def ratio(runs: dict[str, list[dict]], a: str, b: str) -> float:
    """Median over seeds of the throughput ratio a / b."""
    return statistics.median(x["examples_per_sec"] / y["examples_per_sec"]
                             for x, y in zip(runs[a], runs[b]))


def _spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else 0.0


def verdict_accuracy(ds: str, runs: dict[str, list[dict]]) -> list[tuple[str, bool, str]]:
    """Table 2 on one dataset, scored on every seed (a verdict is not one lucky seed): the gap
    as the paper states it (|sync - hybrid| < PAR), hybrid no worse than that, async lower."""
    gap = paired(runs, "sync", "hybrid")
    lo_s, lo_h = paired(runs, "sync", "async"), paired(runs, "hybrid", "async")
    lo, hi = ci95(gap)
    nums = (f"sync - hybrid per seed {_list(gap)}, mean {statistics.fmean(gap):+.4f}, 95% interval "
            f"of the mean [{lo:+.4f}, {hi:+.4f}]")
    return [
        (f"{ds}: hybrid's AUC within {PAR} of sync's on every seed (|sync - hybrid| < {PAR})",
         max(abs(g) for g in gap) < PAR, nums),
        (f"{ds}: hybrid not worse than sync by {PAR} or more on any seed (sync - hybrid < {PAR})",
         max(gap) < PAR, nums),
        (f"{ds}: async's AUC below both sync's and hybrid's on every seed",
         min(lo_s) > 0 and min(lo_h) > 0,
         f"sync - async {_list(lo_s)}, hybrid - async {_list(lo_h)} (the paper: sync - async "
         "0.0027-0.0092)")]


def verdict_speed(runs: dict[str, list[dict]], clock: str, hs: float | None = None,
                  ah: float | None = None) -> list[tuple[str, bool, str]]:
    """Sec. 6.3 on per-run throughputs (or given median ratios hybrid/sync, async/hybrid)."""
    hs = ratio(runs, "hybrid", "sync") if hs is None else hs
    ah = ratio(runs, "async", "hybrid") if ah is None else ah
    return [(f"{clock}: hybrid much faster than sync (>= {FASTER}x)", hs >= FASTER,
             f"hybrid / sync = {hs:.2f}"),
            (f"{clock}: async somewhat faster than hybrid (async >= hybrid >= {NEAR}x async)",
             ah >= 1.0 and 1.0 / ah >= NEAR, f"async / hybrid = {ah:.2f} (hybrid / async = "
             f"{1.0 / ah:.2f}; the paper's Fig. 9: async 1.2x hybrid)")]


def tau_curve(sweep: dict[str, list[dict]]) -> list[tuple[int, dict, int]]:
    """(tau, AUC stats over seeds, largest realised staleness) in tau order."""
    return [(int(t), stats([r["eval_auc"] for r in rs]), max(r["staleness_max"] for r in rs))
            for t, rs in sorted(sweep.items(), key=lambda kv: int(kv[0]))]


def verdict_tau(sweep: dict[str, list[dict]]) -> list[tuple[str, bool, str]]:
    """Eq. 6's extra term grows with alpha * tau: AUC falls as tau grows, on every seed."""
    curve = tau_curve(sweep)
    t0, tmax = str(curve[0][0]), str(curve[-1][0])
    drop = [a["eval_auc"] - b["eval_auc"] for a, b in zip(sweep[t0], sweep[tmax])]
    rho = _spearman([t for t, _, _ in curve], [s["mean"] for _, s, _ in curve])
    reached = all(m == t for t, _, m in curve)
    return [(f"AUC falls as tau grows (tau={t0} above tau={tmax} on every seed, rank "
             "correlation < 0)", min(drop) > 0 and rho < 0,
             f"AUC(tau={t0}) - AUC(tau={tmax}) per seed {_list(drop)}; Spearman rho(tau, mean "
             f"AUC) = {rho:+.2f}"),
            ("the staleness bound is reached at every tau (embedding_staleness.max == tau)",
             reached, ", ".join(f"tau {t}: max {m}" for t, _, m in curve))]


def _list(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:+.4f}" for x in xs) + "]"


def verdicts(res: dict, bench: dict | None = None) -> list[tuple[str, bool, str]]:
    out = []
    for ds, d in res["datasets"].items():
        if "runs" in d:
            out += verdict_accuracy(ds, d["runs"])
    if "synthetic" in res["datasets"] and "runs" in res["datasets"]["synthetic"]:
        out += verdict_speed(res["datasets"]["synthetic"]["runs"], "virtual clock (synthetic)")
    if bench:
        rows = {r["mode"]: r for r in bench["rows"] if r["clock"] == "threads"}
        out += verdict_speed({}, f"threads ({rows['hybrid']['repeats']} interleaved repeats, "
                             "scripts/bench_persia.py)", rows["hybrid"]["ratio_to_sync_median"],
                             1.0 / rows["hybrid"]["ratio_to_async_median"])
    if res.get("tau"):
        out += verdict_tau(res["tau"]["runs"])
    return out


# -- reporting ----------------------------------------------------------------------------------
def _f(x, fmt=".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ms(s: dict, fmt=".4f") -> str:
    return f"{_f(s['mean'], fmt)} ± {_f(s['sd'], fmt)}" if s["n"] > 1 else _f(s["mean"], fmt)


def auc_se(a: float, n: int, ctr: float) -> float:
    """Hanley & McNeil (1982) standard error of one AUC on `n` eval rows with click rate `ctr`."""
    n1 = max(round(n * ctr), 1)
    n0 = max(n - n1, 1)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    return math.sqrt(max(a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a), 0.0)
                     / (n0 * n1))


def report(res: dict, bench: dict | None = None) -> str:
    meta = res["meta"]
    out = [f"`{meta['command']}`, {meta['secs']:.0f} s. {meta['settings']}", "",
           "### Table 2 analogue: eval AUC and NE per mode (mean ± sd over seeds)", "",
           "| dataset | alpha | seeds | hybrid AUC | sync AUC | async AUC | sync - hybrid | "
           "sync - async | hybrid NE | sync NE | async NE | AUC s.e. |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for ds, d in res["datasets"].items():
        if "runs" not in d:
            out.append(f"| {ds} | - | - | skipped: {d['skipped']} | | | | | | | | |")
            continue
        r = d["runs"]
        auc = {m: stats([x["eval_auc"] for x in r[m]]) for m in MODES}
        ne = {m: stats([x["eval_ne"] for x in r[m]]) for m in MODES}
        last = r["sync"][0]
        out.append(f"| {ds} | {_f(d['alpha']['alpha'], '.2f')} | {len(r['sync'])} | "
                   + " | ".join(_ms(auc[m]) for m in MODES) + " | "
                   + f"{_ms(stats(paired(r, 'sync', 'hybrid')), '+.4f')} | "
                   + f"{_ms(stats(paired(r, 'sync', 'async')), '+.4f')} | "
                   + " | ".join(_ms(ne[m]) for m in MODES)
                   + f" | {auc_se(auc['sync']['mean'], last['eval_examples'], last['eval_ctr']):.4f} |")
    out += ["", "alpha: the largest fraction of training samples containing one id (Theorem 1). "
            "AUC s.e.: Hanley-McNeil standard error of one AUC on that eval set; the differences "
            "are paired (same data order and eval rows per seed) and vary less than that.", "",
            "### Throughput per mode (virtual clock, examples per modelled second; median over "
            "seeds)", "", "| dataset | hybrid | sync | async | hybrid / sync | hybrid / async | "
            "emb. staleness mean (max) | async dense staleness mean |", "|---|---|---|---|---|---|---|---|"]
    for ds, d in res["datasets"].items():
        if "runs" not in d:
            continue
        r = d["runs"]
        eps = {m: statistics.median(x["examples_per_sec"] for x in r[m]) for m in MODES}
        out.append(f"| {ds} | " + " | ".join(f"{eps[m]:,.0f}" for m in MODES)
                   + f" | {ratio(r, 'hybrid', 'sync'):.2f} | {ratio(r, 'hybrid', 'async'):.2f} | "
                   f"{r['hybrid'][0]['staleness_mean']:.2f} ({r['hybrid'][0]['staleness_max']}) | "
                   f"{_f(r['async'][0]['dense_staleness_mean'], '.2f')} |")
    if bench:
        out += ["", "Threads (wall clock, `scripts/bench_persia.py`, its own setting): "
                + ", ".join(f"{r['mode']} {r['examples_per_sec_median']:,.0f} ex/s"
                            for r in bench["rows"] if r["clock"] == "threads") + "."]
    if res.get("tau"):
        t = res["tau"]
        out += ["", f"### Eval AUC vs the staleness bound tau ({t['dataset']}, hybrid, "
                f"{TAU_EMB} embedding workers, alpha = {t['alpha']:.2f})", "",
                "| tau | eval AUC | realised staleness max | staleness mean |", "|---|---|---|---|"]
        for tau, s, m in tau_curve(t["runs"]):
            mean = statistics.fmean(r["staleness_mean"] for r in t["runs"][str(tau)])
            out.append(f"| {tau} | {_ms(s)} | {m} | {mean:.2f} |")
    if res.get("lru"):
        lr = res["lru"]
        out += ["", "### Dynamic ids: Criteo sample, LRU store vs fixed tables (hybrid, seed 0)", ""]
        if "skipped" in lr:
            out.append(f"Skipped: {lr['skipped']} (capacity would have been {lr['capacity']}).")
        else:
            fixed = res["datasets"]["criteo"]["runs"]["hybrid"][0]
            out += ["| store | rows per table | eval AUC | eval NE | admitted | evicted | "
                    "not admitted | dropped gradients |", "|---|---|---|---|---|---|---|---|",
                    f"| fixed (hashed) | 2^15 buckets | {fixed['eval_auc']:.4f} | "
                    f"{fixed['eval_ne']:.4f} | - | - | - | - |"]
            for key in ("lru_roomy", "lru"):
                r, c = lr[key], lr[key]["lru"]
                cap = lr["capacity" if key == "lru" else "roomy_capacity"]
                out.append(f"| lru | {cap} | {r['eval_auc']:.4f} | {r['eval_ne']:.4f} | "
                           f"{c.get('admitted')} | {c.get('evicted')} | {c.get('not_admitted')} | "
                           f"{c.get('dropped_gradients')} |")
            out += ["", f"Raw ids: the largest field has {lr['max_distinct_ids_per_field']} distinct "
                    f"ids; {lr['fields_over_capacity']} of {lr['fields']} fields have more than "
                    f"{lr['capacity']}."]
    out += ["", "### Verdicts", ""]
    for claim, ok, nums in verdicts(res, bench):
        out.append(f"- {claim}: **{'held' if ok else 'did not hold'}** ({nums})")
    return "\n".join(out) + "\n"


def plot(res: dict, path: pathlib.Path, bench: dict | None = None) -> None:
    """(a) eval AUC vs tau, mean ± sd over seeds; (b) examples/s per mode."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [1.4, 1]})
    if res.get("tau"):
        curve = tau_curve(res["tau"]["runs"])
        ts = [t for t, _, _ in curve]
        ax.errorbar(ts, [s["mean"] for _, s, _ in curve], yerr=[s["sd"] for _, s, _ in curve],
                    fmt="o-", capsize=3, color="C0", label="hybrid")
        ax.set_xscale("symlog", base=2, linthresh=1)
        ax.set_xticks(ts, [str(t) for t in ts])
        ax.set_xlabel("staleness bound tau (global batches, log scale)")
        ax.set_ylabel("eval AUC")
        ax.set_title(f"(a) AUC vs tau, {res['tau']['dataset']} "
                     f"(mean ± sd, {len(next(iter(res['tau']['runs'].values())))} seeds)", fontsize=9)
        ax.grid(alpha=0.3)
    ds = res["datasets"].get("synthetic", {})
    bars = {}  # label -> examples/s per mode, all bars from one setting
    if bench:  # bench_persia.py measures both clocks on its own setting: plot those together
        for clock, label in (("virtual", "virtual clock (modelled)"), ("threads", "threads, 2 cores (wall)")):
            rows = {r["mode"]: r["examples_per_sec_median"] for r in bench["rows"] if r["clock"] == clock}
            if rows:
                bars[label] = [rows[m] for m in MODES]
        where = f"bench_persia.py, B {bench['meta']['global_batch']}, tau {bench['meta']['tau']}"
    elif "runs" in ds:
        bars["virtual clock (modelled)"] = [
            statistics.median(x["examples_per_sec"] for x in ds["runs"][m]) for m in MODES]
        where = "study, synthetic"
    if bars:
        w = 0.8 / len(bars)
        for i, (label, eps) in enumerate(bars.items()):
            bx.bar([x + (i - (len(bars) - 1) / 2) * w for x in range(len(MODES))],
                   [e / 1e3 for e in eps], w, label=label, color=f"C{i}")
        bx.set_xticks(list(range(len(MODES))), MODES)
        bx.set_ylabel("throughput (1000 examples / s)")
        bx.set_title(f"(b) throughput ({where})", fontsize=9)
        bx.legend(fontsize=7)
        bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".svg"))
    fig.savefig(path.with_suffix(".png"), dpi=100)
    plt.close(fig)


BEGIN, END = "<!-- persia-study:begin -->", "<!-- persia-study:end -->"


def write_docs(res: dict, bench: dict | None, docs: pathlib.Path) -> None:
    """Replace the generated part of docs/persia.md (between the markers) and its plot."""
    doc = docs / "persia.md"
    text = doc.read_text() if doc.exists() else f"# Persia\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{BEGIN}\n{report(res, bench)}{END}{tail}")
    plot(res, docs / "persia_study", bench)


def _enable_compile_cache(directory: pathlib.Path) -> None:
    """Every run rebuilds its jitted functions; the persistent cache makes the rebuilds loads."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def study(args, size: str, seeds: int, log=print) -> dict:
    """Every part of the study (a: Table 2, b: throughput, c: tau sweep, d: LRU) as one dict."""
    from recjax.data.sources import DataError, resolve_path

    taus = args.taus if args.taus is not None else ",".join(map(str, QUICK_TAUS if size != "full"
                                                                else TAUS))
    res: dict = {"datasets": {}, "tau": None, "lru": None}
    for ds in args.datasets.split(","):
        paths = ("", "")
        if ds != "synthetic":
            try:
                paths = tuple(resolve_path(f) for f in REAL[ds][1:])
            except DataError as e:
                log(f"skipping {ds}: {e}")
                res["datasets"][ds] = {"skipped": f"data not found ({REAL[ds][1]})"}
                continue
        c = base_config(ds, size, paths, args.sparse_lr)
        alpha = id_alpha(c)
        log(f"{ds}: alpha {alpha['alpha']:.3f} ({alpha['field']}), {alpha['samples']} samples")
        res["datasets"][ds] = {"alpha": alpha, "runs": table2(c, seeds, log)}
        if ds == "synthetic" and taus:
            log("synthetic: AUC vs tau")
            res["tau"] = {"dataset": ds, "alpha": alpha["alpha"], "embedding_workers": TAU_EMB,
                          "runs": tau_sweep(c, [int(t) for t in taus.split(",")], seeds, log)}
        if ds == "criteo":
            log("criteo: dynamic ids (LRU store)")
            res["lru"] = lru_study(c, alpha, log)
    res["meta"] = {
        "size": size, "seeds": seeds,
        "settings": f"Settings: {NN} NN workers, {EMB} embedding workers, tau = {TAU} (sweep: "
        f"{TAU_EMB} embedding workers), embedding stragglers `{STRAGGLERS}`, deterministic "
        "virtual clock, seeds 0.." + str(seeds - 1) + ". Synthetic: DLRM (`configs.default()`, "
        "Adam 2e-3 / Adagrad 0.05), global batch 256, one pass; real samples: DeepFM (D = 8, deep "
        f"64-32, Adam 1e-3 / Adagrad {args.sparse_lr}, 2^15 hash buckets), batch 128 for one epoch "
        "(Taobao: 32 for 10 epochs), eval on the sample's own valid file."}
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="compare.py persia", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter runs, fewer seeds (< 3 min)")
    p.add_argument("--smoke", action="store_true", help="seconds-long tiny runs (tests)")
    p.add_argument("--seeds", type=int, default=0, help="seeds per cell (0 = the size's default)")
    p.add_argument("--datasets", default="synthetic,criteo,avazu,taobao", help="comma-separated")
    p.add_argument("--data", help="data folder the relative data paths are under (default "
                   "$RECJAX_DATA, else ../shared/data next to the checkout)")
    p.add_argument("--taus", help="tau sweep, comma-separated (default 0,1,2,4,8,16; --quick "
                   "0,1,4,16; empty = none)")
    p.add_argument("--out", default=str(ROOT / "runs" / "compare_persia"), help="output folder")
    p.add_argument("--sparse-lr", type=float, default=SPARSE_LR, help="real samples' Adagrad lr")
    p.add_argument("--bench-json", help="scripts/bench_persia.py --out file to cite")
    p.add_argument("--from-json", help="no runs: re-report an earlier OUT/persia_study.json "
                   "(e.g. with a new --bench-json)")
    p.add_argument("--write-docs", action="store_true", help="also rewrite docs/persia.md's "
                   "generated part and docs/persia_study.{svg,png}")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if args.data:  # recjax.data.sources.resolve_path looks relative paths up here
        os.environ["RECJAX_DATA"] = args.data
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    seeds = args.seeds or SEEDS[size]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _enable_compile_cache(out / "jax_cache")
    t0 = time.perf_counter()
    log = lambda s: print(s, flush=True)
    if args.from_json:
        res = json.loads(pathlib.Path(args.from_json).read_text())
    else:
        res = study(args, size, seeds, log)
        res["meta"].update(command=" ".join(["python scripts/compare.py persia"] + argv),
                           secs=time.perf_counter() - t0)
    bench = json.loads(pathlib.Path(args.bench_json).read_text()) if args.bench_json else None
    (out / "persia_study.json").write_text(json.dumps(res, indent=1))
    (out / "persia_study.md").write_text(report(res, bench))
    plot(res, out / "persia_study", bench)
    if args.write_docs:
        write_docs(res, bench, ROOT / "docs")
    log(f"wrote {out}/persia_study.{{json,md,svg,png}} ({time.perf_counter() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
