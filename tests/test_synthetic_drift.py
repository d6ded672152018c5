"""A synthetic teacher that drifts from day to day (issue 36 step 3): ``synthetic.days`` cuts the
training stream into days in order, ``synthetic.drift`` moves every teacher weight one AR(1)
step per day, and each day's Bayes-optimal NE is known.

References written here: the day-d weights by the recursion of the docstring, the FM logit
summed over field pairs (not the |sum|^2 identity the generator uses), NE as its definition.
"""

import dataclasses

import numpy as np
import pytest

from recjax.data.synthetic import PRESETS, SyntheticConfig, SyntheticSource, day_teacher

SMALL = dataclasses.replace(PRESETS["smoke"], n_train=3000, n_eval=1000)


def _stream(cfg, split="train"):
    src = SyntheticSource(cfg, split)
    src.CHUNK = 700  # several chunks, each crossing a day boundary somewhere
    return src


def _all(src):
    chunks = list(src.chunks())
    return {k: np.concatenate([getattr(c, k) for c in chunks]) for k in ("dense", "ids", "label")}


def _weights(cfg, day):
    """Day `day`'s (w, v, u) by the recursion, from day 0's (the preset's teacher)."""
    t0 = day_teacher(cfg, 0)
    w, v, u = [x.copy() for x in t0.w], [x.copy() for x in t0.v], t0.u.copy()
    a, b = np.sqrt(1 - cfg.drift ** 2), cfg.drift
    for d in range(1, day + 1):
        rng = np.random.default_rng([cfg.seed, 8, d])
        w = [(a * x + b * cfg.first_order_std * rng.normal(0, 1, x.shape)).astype(np.float32)
             for x in w]
        v = [(a * x + b * cfg.pairwise_std * rng.normal(0, 1, x.shape)).astype(np.float32)
             for x in v]
        u = (a * u + b * cfg.dense_std * rng.normal(0, 1, u.shape)).astype(np.float32)
    return w, v, u


def _logit(cfg, day, dense, ids):
    w, v, u = _weights(cfg, day)
    z = cfg.bias + dense.astype(np.float64) @ u
    n_fields = ids.shape[1]
    for f in range(n_fields):
        z = z + w[f][ids[:, f]]
        for g in range(f + 1, n_fields):
            z = z + (v[f][ids[:, f]].astype(np.float64) * v[g][ids[:, g]]).sum(1)
    return z


def test_no_drift_is_the_one_teacher_stream():
    base = _all(_stream(SMALL))
    for days in (1, 4):
        got = _all(_stream(dataclasses.replace(SMALL, days=days)))
        for k in base:
            np.testing.assert_array_equal(got[k], base[k], err_msg=k)
    drifting = _all(_stream(dataclasses.replace(SMALL, days=3, drift=0.5)))
    np.testing.assert_array_equal(drifting["ids"], base["ids"])  # same features, other labels
    assert (drifting["label"] != base["label"]).any()


@pytest.mark.parametrize("days,drift", [(3, 0.5), (4, 1.0)])
def test_each_days_examples_follow_that_days_teacher(days, drift):
    cfg = dataclasses.replace(SMALL, days=days, drift=drift)
    src = _stream(cfg)
    y, p = src.labels_and_bayes_probs()
    x = _all(src)
    day = np.arange(cfg.n_train) * days // cfg.n_train
    assert np.bincount(day).tolist() == [cfg.n_train // days] * days
    for d in range(days):
        at = day == d
        want = 1 / (1 + np.exp(-_logit(cfg, d, x["dense"][at], x["ids"][at, :, 0])))
        np.testing.assert_allclose(p[at], want, rtol=1e-4, atol=1e-6)
    # the eval stream is the day after the last
    ev = _stream(cfg, "eval")
    ye, pe = ev.labels_and_bayes_probs()
    xe = _all(ev)
    want = 1 / (1 + np.exp(-_logit(cfg, days, xe["dense"], xe["ids"][:, :, 0])))
    np.testing.assert_allclose(pe, want, rtol=1e-4, atol=1e-6)


def test_drift_keeps_the_stds_and_decorrelates_by_day():
    cfg = dataclasses.replace(PRESETS["default"], cardinalities=(20000, 30000), days=6,
                              drift=0.4)
    w0 = day_teacher(cfg, 0).w[1]
    for d in (1, 3, 5):
        wd = day_teacher(cfg, d).w[1]
        assert abs(wd.std() / cfg.first_order_std - 1) < 0.03  # stationary: the same std
        rho = np.corrcoef(w0, wd)[0, 1]
        assert abs(rho - (1 - 0.4 ** 2) ** (d / 2)) < 0.03, (d, rho)
    assert abs(np.corrcoef(day_teacher(dataclasses.replace(cfg, drift=1.0), 1).w[1],
                           w0)[0, 1]) < 0.03  # drift 1: a fresh teacher


def test_bayes_ne_by_day():
    cfg = dataclasses.replace(SMALL, days=3, drift=0.7)
    src = _stream(cfg)
    y, p = src.labels_and_bayes_probs()
    by_day = src.bayes_optimal_by_day()
    assert sorted(by_day) == [0, 1, 2]
    for d in range(3):
        yd, pd = y[d * 1000:(d + 1) * 1000].astype(np.float64), p[d * 1000:(d + 1) * 1000]
        logloss = -np.mean(yd * np.log(pd) + (1 - yd) * np.log(1 - pd))
        ctr = yd.mean()
        ne = logloss / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
        assert by_day[d]["ne"] == pytest.approx(ne, rel=1e-6)
    assert list(_stream(cfg, "eval").bayes_optimal_by_day()) == [3]


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="synthetic.days"):
        SyntheticConfig(days=0)
    with pytest.raises(ValueError, match="drift in"):
        SyntheticConfig(drift=1.5)


def test_eval_day_picks_the_eval_streams_teacher():
    cfg = dataclasses.replace(SMALL, days=3, drift=0.6)
    train = _all(_stream(cfg))
    for d in (0, 2, 3):
        other = dataclasses.replace(cfg, eval_day=d)
        ev = _stream(other, "eval")
        _, p = ev.labels_and_bayes_probs()
        x = _all(ev)
        want = 1 / (1 + np.exp(-_logit(cfg, d, x["dense"], x["ids"][:, :, 0])))
        np.testing.assert_allclose(p, want, rtol=1e-4, atol=1e-6)
        got = _all(_stream(other))  # the training stream does not depend on it
        np.testing.assert_array_equal(got["label"], train["label"])
    with pytest.raises(ValueError, match="eval_day"):
        dataclasses.replace(cfg, eval_day=4)


def test_day_by_day_with_an_algorithm_switch(tmp_path):
    """Train day 0 with `single` evaluating day 1, then --resume day 1 with `sync` on 2 devices
    evaluating day 2: each segment's eval is its next day's (the Bayes NE of that day's eval
    stream), and metrics.jsonl holds both."""
    import json

    import algorithms
    from recjax import cli

    def run(*args):
        cfg, _ = cli.parse(["--config", "smoke", "--data", "synthetic:smoke", "--batch-size", "64",
                            "--no-progress", "--synthetic.n_train=4096",
                            "--synthetic.n_eval=2000", "--synthetic.days=2",
                            "--synthetic.drift=0.8", "--out", str(tmp_path), *args], "t")
        return algorithms.run(cfg), cfg

    first, c1 = run("--steps", "32", "--synthetic.eval_day=1")
    second, c2 = run("--steps", "64", "--resume", "--algo", "sync", "--devices", "2",
                     "--synthetic.eval_day=2")
    assert second["resumed_from_step"] == 32 and second["algorithm"] == "sync"
    for s, c in ((first, c1), (second, c2)):
        assert s["bayes_eval_ne"] == SyntheticSource(c.synthetic, "eval").bayes_optimal()["ne"]
    assert first["bayes_eval_ne"] != second["bayes_eval_ne"]
    evals = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(r)["kind"] == "eval"]
    assert [e["step"] for e in evals] == [32, 64]
