"""The verdict rules of the ShadowSync study (scripts/compare_shadowsync.py), as pure functions.

Each claim is checked on per-seed numbers, never on one run: seeds change parameter init and
data order (``train.seed``), not the eval set, so two variants run with the same seed are paired
and their per-seed differences cancel most of the seed noise.

Rules (Zheng et al., arXiv 2003.03477):

* ``lower(a, b)``: "a has lower NE than b" (Table 2 / Sec. 4.1.1 "S-EASGD outperforms FR-EASGD";
  Fig. 6 / Sec. 4.1.3 "The ShadowSync versions achieve lower NE") is **held** iff the mean of the
  paired differences d_s = b_s - a_s exceeds Z standard errors of that mean (Z = 2, about a 95%
  two-sided interval), i.e. a is lower by more than the seed noise can explain. Otherwise
  **not held**, with the reason: within noise, or reversed (b lower by more than Z SE).
* ``increases(by_k)``: "Eval NE of FR-EASGD increases as the sync gap goes up" (Sec. 4.1.1,
  Table 2: 0.78483 < 0.78508 < 0.78523 < 0.78531 for k = 5, 10, 30, 100) is **held** iff the
  seed-mean NE rises at every step of k *and* the rise from the smallest to the largest k exceeds
  Z standard errors of its paired difference. A non-monotonic sequence of means is not held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Z = 2.0  # standard errors a difference must exceed to count as a difference
HELD, NOT_HELD = "held", "not held"

# The paper's Table 2 (Dataset-1, 11 trainers): name -> (sync gap, Train NE, Eval NE).
PAPER_TABLE2 = {"S-EASGD": (5.21, 0.78926, 0.78451), "FR-EASGD k=5": (5, 0.78942, 0.78483),
                "FR-EASGD k=10": (10, 0.78937, 0.78508), "FR-EASGD k=30": (30, 0.78942, 0.78523),
                "FR-EASGD k=100": (100, 0.78969, 0.78531)}


def summary(xs: Sequence[float]) -> dict:
    """Mean, sample standard deviation (ddof 1; 0 for one value), min, max and n of `xs`."""
    if not xs:
        raise ValueError("summary() of no values: every variant needs at least one seed")
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(xs), "max": max(xs), "n": n}


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
    """Mean and standard error of d_s = b_s - a_s over seeds (a and b in the same seed order)."""
    if len(a) != len(b):
        raise ValueError(f"paired(): {len(a)} vs {len(b)} seeds; run both variants on the same "
                         "seeds")
    if len(a) < 2:
        raise ValueError("paired(): one seed gives no noise estimate; run the study with "
                         "--seeds 2 or more (3 is the default)")
    d = [y - x for x, y in zip(a, b)]
    s = summary(d)
    return {"mean": s["mean"], "se": s["sd"] / math.sqrt(len(d)), "n": len(d)}


def lower(a: Sequence[float], b: Sequence[float]) -> dict:
    """Is `a` lower than `b` beyond the seed noise? (NE: lower is better.)"""
    p = paired(a, b)
    if p["mean"] > Z * p["se"]:
        return {"verdict": HELD, "reason": "lower by more than 2 SE", **p}
    why = "reversed: higher by more than 2 SE" if -p["mean"] > Z * p["se"] else "within noise"
    return {"verdict": NOT_HELD, "reason": why, **p}


def increases(by_k: Mapping[int, Sequence[float]]) -> dict:
    """Does the mean rise at every step of k, and the first-to-last rise exceed 2 SE?"""
    ks = sorted(by_k)
    if len(ks) < 2:
        raise ValueError("increases() needs at least two values of k")
    means = [summary(by_k[k])["mean"] for k in ks]
    steps_up = all(b > a for a, b in zip(means, means[1:]))
    p = paired(by_k[ks[0]], by_k[ks[-1]])
    big = p["mean"] > Z * p["se"]
    if steps_up and big:
        verdict, why = HELD, "means rise at every step, first-to-last by more than 2 SE"
    elif not steps_up:
        down = [f"k={ks[i]}->{ks[i + 1]}" for i in range(len(ks) - 1) if means[i + 1] <= means[i]]
        verdict, why = NOT_HELD, "not monotonic: mean does not rise at " + ", ".join(down)
    else:
        verdict, why = NOT_HELD, "monotonic, but first-to-last rise within 2 SE"
    return {"verdict": verdict, "reason": why, "means": dict(zip(ks, means)), **p}


def fr_cap(k: int, exchange_iters: float, single_eps: float) -> float:
    """Examples/sec an FR-EASGD run cannot exceed, whatever the number of trainers.

    Every worker iteration needs 1/k of an exchange on the one sync PS link, and one exchange
    holds the link for `exchange_iters` iterations' time, so the link admits at most
    k / exchange_iters iterations per iteration time: k / exchange_iters single-trainer EPS.
    The study sizes the link, so this cap is set by construction, not measured.
    """
    return k / exchange_iters * single_eps
