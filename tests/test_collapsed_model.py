"""A model that gives every eval row the same prediction (collapsed: e.g. the GBA study's Async
arm of seed 7, AUC exactly 0.5 from its second chunk on) is named, not only scored: the
summary's ``eval_logit_spread`` is 0 and a warning says so, and a study report lists such
segments by arm, phase and seed.

The spread is checked against numpy over the real eval rows only: the eval pass pads its last
batch, and a padding row's logit must not widen (or narrow) it.
"""

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import algorithms
from recjax import configs
from recjax.study import report, runner
from recjax.train import contract, loop
from recjax.train.data import open_data
from tests.test_study_kit import STUDY, FakeRun


def _cfg(tmp_path, **train):
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, synthetic=dataclasses.replace(cfg.synthetic, n_train=2048, n_eval=1000),
        train=dataclasses.replace(cfg.train, **{
            "algo": "single", "steps": 4, "batch_size": 64, "eval_batch_size": 256,
            "progress": False, "out": str(tmp_path / "run"), **train}))


def test_the_spread_is_over_the_real_eval_rows_only(tmp_path):
    cfg = _cfg(tmp_path)
    data = open_data(cfg)
    seen = []

    def predict(params, tables, batch):  # distinct logits; the padding rows' far outside
        b = batch.label.shape[0]
        z = np.arange(b, dtype=np.float32) / 7.0 + len(seen)
        seen.append(z)
        return z

    ev, _ = contract.evaluate(cfg, data, predict, None, None)
    # 1,000 rows in batches of 256: the last batch has 232 real rows and 24 of padding
    real = np.concatenate([z[:256] for z in seen[:-1]] + [seen[-1][:1000 - 256 * 3]])
    assert len(seen) == 4 and real.size == 1000
    assert ev["logit_spread"] == pytest.approx(float(real.max() - real.min()))
    assert ev["logit_spread"] < float(seen[-1].max() - seen[0].min())  # padding left out

    # one logit for every real row; the padding rows of the last batch another
    calls = []

    def constant(params, tables, batch):
        calls.append(1)
        z = np.full(batch.label.shape[0], -0.65, np.float32)
        if len(calls) == 4:  # the padded last batch
            z[1000 - 256 * 3:] = 9.0
        return z

    assert contract.evaluate(cfg, data, constant, None, None)[0]["logit_spread"] == 0.0


def test_a_run_whose_model_predicts_a_constant_says_so(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    summary = algorithms.run(cfg)
    assert summary["eval_logit_spread"] > 0
    assert not any("constant predictor" in w for w in summary["warnings"])

    # the same run with a predict that ignores its inputs: every eval row gets one logit
    monkeypatch.setattr(loop, "jit_predict",
                        lambda model: lambda p, t, b: jnp.full(b.label.shape[0], -0.65))
    cfg = _cfg(tmp_path, out=str(tmp_path / "collapsed"))
    summary = algorithms.run(cfg)
    assert summary["eval_logit_spread"] == 0 and summary["eval_auc"] == 0.5
    [w] = [w for w in summary["warnings"] if "constant predictor" in w]
    assert "every one of the 1000 eval predictions is the same" in w
    with open(os.path.join(cfg.train.out, "summary.json")) as f:
        assert json.load(f)["eval_logit_spread"] == 0


def test_a_study_report_lists_its_collapsed_segments(tmp_path):
    class Collapsing(FakeRun):  # arm a (async) collapses on seed 1 from its second chunk
        def __call__(self, cfg):
            s = super().__call__(cfg)
            tc = cfg.train
            dead = tc.algo == "async" and tc.seed == 1 and tc.steps >= 20
            s["eval_logit_spread"] = 0.0 if dead else 1.5
            if dead:
                s["eval_auc"] = 0.5
            with open(os.path.join(tc.out, "summary.json"), "w") as f:
                json.dump(s, f)
            return s

    res = runner.run_study(STUDY, "quick", str(tmp_path), Collapsing(), log=lambda s: None)
    rows = res["synthetic"]
    assert {r["eval_logit_spread"] for r in rows} == {0.0, 1.5}
    text = report.markdown(STUDY, res, "cmd", 1.0)
    assert "### Collapsed runs" in text
    listed = text.split("### Collapsed runs")[1].strip().splitlines()[2:]
    # a's forward chunks 2 and 3 (steps 20, 25); its back copy runs single (no collapse)
    assert listed == ["- a, forward, seed 1: chunks 2, 3"]
    # a study with none says nothing
    res = runner.run_study(STUDY, "quick", str(tmp_path / "none"), FakeRun(), log=lambda s: None)
    assert "Collapsed" not in report.markdown(STUDY, res, "cmd", 1.0)
