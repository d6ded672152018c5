"""Early stopping and the best checkpoint (train.early_stop_patience, train.monitor,
train.keep_best) on hand-written metric sequences."""

import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest

from recjax import configs
from recjax.checkpoint import Checkpointer
from recjax.config import Config, apply_overrides
from recjax.train import contract
from recjax.train.early_stop import EarlyStopper
from recjax.train.loop import run
from recjax.train.setup import make_model
from tests.test_features_defaults import SPEC


def _walk(stopper, values, every=10):
    """Feed evals at steps every, 2 every, ...; the step it stops at (or None)."""
    for i, v in enumerate(values):
        step = (i + 1) * every
        stopper.update(step, {stopper.key: v})
        if stopper.should_stop:
            return step
    return None


def test_auc_is_maximised_and_stops_after_patience_evals_without_improvement():
    s = EarlyStopper("eval_auc", patience=2)
    # 0.60 best, 0.70 best, 0.69 (1), 0.71 best, 0.71 (1: equal is no improvement), 0.65 (2) stop
    assert _walk(s, [0.60, 0.70, 0.69, 0.71, 0.71, 0.65, 0.99]) == 60
    assert (s.best_step, s.best) == (40, 0.71)


@pytest.mark.parametrize("monitor", ["eval_ne", "eval_logloss"])
def test_ne_and_logloss_are_minimised(monitor):
    s = EarlyStopper(monitor, patience=3)
    assert _walk(s, [0.9, 0.8, 0.85, 0.79, 0.80, 0.81, 0.82, 0.1]) == 70
    assert (s.best_step, s.best) == (40, 0.79)


def test_nan_never_improves_and_patience_zero_never_stops():
    s = EarlyStopper("eval_auc", patience=2)
    assert _walk(s, [math.nan, 0.5, math.nan, math.nan]) == 40
    assert (s.best_step, s.best) == (20, 0.5)
    s = EarlyStopper("eval_auc", patience=0)
    assert _walk(s, [0.9] + [0.1] * 20) is None and s.best_step == 10


def _cfg(tmp_path, **train):
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, synthetic=dataclasses.replace(cfg.synthetic, n_train=8192, n_eval=512),
        train=dataclasses.replace(cfg.train, **{
            "steps": 20, "batch_size": 64, "eval_every": 2, "progress": False,
            "eval_batch_size": 512, "out": str(tmp_path / "run"), **train}))


def _scripted(monkeypatch, aucs):
    """contract.evaluate with its AUC replaced by the next value of `aucs`."""
    real, it = contract.evaluate, iter(aucs)

    def fake(*a, **k):
        ev, preds = real(*a, **k)
        return {**ev, "auc": next(it)}, preds

    monkeypatch.setattr(contract, "evaluate", fake)


def test_run_stops_at_the_right_eval_and_keeps_the_best_checkpoint(tmp_path, monkeypatch):
    # evals at steps 2, 4, ...: best 0.71 at step 8, then 0.70 and 0.68 -> stop at step 12
    _scripted(monkeypatch, [0.60, 0.70, 0.69, 0.71, 0.70, 0.68, 0.5, 0.5])
    cfg = _cfg(tmp_path, early_stop_patience=2)
    summary = run(cfg)
    assert summary["steps"] == 12 and summary["early_stopped"] is True
    assert (summary["best_step"], summary["best_metric"]) == (8, 0.71)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (on_disk["best_step"], on_disk["monitor"]) == (8, "eval_auc")
    best = Checkpointer(os.path.join(cfg.train.out, "best"))
    assert best.all_steps() == [8]  # one kept: the best
    like = jax.tree.map(np.asarray, summary["final_state"])
    state, meta = best.restore(like)
    best.close()
    assert int(state.step) == 8 and meta["config"]["train"]["early_stop_patience"] == 2
    assert not all(np.array_equal(np.asarray(a), np.asarray(b))
                   for a, b in zip(jax.tree.leaves(state.tables), jax.tree.leaves(like.tables)))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(x) for x in lines if '"eval"' in x]
    # the eval that stopped the run is the final one: not evaluated (and written) twice
    assert [e["step"] for e in evals] == [2, 4, 6, 8, 10, 12] and evals[-1]["auc"] == 0.68
    assert summary["eval_auc"] == 0.68


def test_keep_best_without_patience_runs_to_the_end_and_counts_the_final_eval(tmp_path,
                                                                               monkeypatch):
    # in-loop evals at 2..18 (9), then the final one at 20 is the best
    _scripted(monkeypatch, [0.6, 0.7, 0.65, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8])
    summary = run(_cfg(tmp_path, keep_best=True))
    assert summary["steps"] == 20 and summary["early_stopped"] is False
    assert (summary["best_step"], summary["best_metric"]) == (20, 0.8)
    assert Checkpointer(str(tmp_path / "run" / "best")).all_steps() == [20]


def test_early_stop_config_errors():
    cfg = apply_overrides(Config(), [("train.early_stop_patience", "3")])
    with pytest.raises(ValueError, match="set train.eval_every > 0"):
        make_model(cfg, SPEC)
    cfg = apply_overrides(Config(), [("train.early_stop_patience", "3"), ("train.eval_every", "5"),
                                     ("train.algo", "gba")])
    make_model(cfg, SPEC)  # every algorithm evaluates in training (tests/test_early_stop_async.py)
    with pytest.raises(ValueError, match="train.monitor must be one of"):
        apply_overrides(Config(), [("train.monitor", "auc")])


def test_a_resumed_run_compares_with_the_best_before_its_checkpoint(tmp_path, monkeypatch):
    """Issue 40 item 2's audit: the tracker's state travels in the checkpoint. Evals every 2
    steps, patience 4: the best 0.9 at step 4; segment one ends at step 10 (its final eval is
    the 3rd without improvement), the resumed one evaluates 0.8 at step 12, the 4th: it stops
    there, and out/best/ still holds step 4, as in the uninterrupted run (a fresh tracker took
    0.8 for the best and wrote step 12 over it)."""
    evals = [0.6, 0.9, 0.7, 0.7, 0.7, 0.8, 0.5, 0.5, 0.5, 0.5]
    _scripted(monkeypatch, evals)
    once = run(_cfg(tmp_path, early_stop_patience=4, keep_best=True, out=str(tmp_path / "once")))
    assert (once["steps"], once["best_step"], once["best_metric"]) == (12, 4, 0.9)

    monkeypatch.undo()  # each _scripted wraps the real evaluate
    _scripted(monkeypatch, evals[:5])
    run(_cfg(tmp_path, early_stop_patience=4, keep_best=True, steps=10))
    monkeypatch.undo()
    _scripted(monkeypatch, evals[5:])
    resumed = run(_cfg(tmp_path, early_stop_patience=4, keep_best=True, resume=True))
    assert (resumed["steps"], resumed["early_stopped"]) == (12, True)
    assert (resumed["best_step"], resumed["best_metric"]) == (4, 0.9)
    assert Checkpointer(str(tmp_path / "run" / "best")).all_steps() == [4]
