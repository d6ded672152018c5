"""Early stopping and the best checkpoint under the host-async algorithms (issue 34 step 2):
the same `EarlyStopper` as the shared trainer, fed by the engine's evals, on hand-written
metric sequences, on the virtual clock.

What the runs must show: the run ends at the eval that ran out of patience, with that eval as
its final one (written once); out/best/ holds the state that was evaluated at the best step
(restored and evaluated again here, it gives the logloss the run recorded there); with periodic
checkpoints the evals at the intervals' ends happen too (they were skipped before), and a stop
at an interval's end ends the run there.
"""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

import algorithms
from recjax import configs
from recjax.checkpoint import Checkpointer
from recjax.train import contract
from recjax.train.data import open_data
from recjax.train.setup import build
from recjax.train.step import jit_predict
from tests.test_features_early_stop import _scripted


def _cfg(tmp_path, algo, **train):
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, synthetic=dataclasses.replace(cfg.synthetic, n_train=8192, n_eval=512),
        train=dataclasses.replace(cfg.train, **{
            "algo": algo, "steps": 32, "batch_size": 64, "eval_every": 4, "progress": False,
            "deterministic": True, "eval_batch_size": 512, "out": str(tmp_path / "run"),
            "log_every": 4, **train}))


def _records(cfg, kind):
    with open(os.path.join(cfg.train.out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def _logloss_of_checkpoint(cfg, directory, step):
    """Restore `directory`'s checkpoint at `step` and evaluate it with the single trainer's
    predict (not the engine's): what that state scores."""
    data = open_data(cfg)
    model, _, _, like = build(cfg, data.spec)
    ckpt = Checkpointer(directory)
    state, _ = ckpt.restore(jax.tree.map(np.asarray, like), step)
    ckpt.close()
    assert int(state.step) == step
    ev, _ = contract.evaluate(cfg, data, jit_predict(model), state.params, state.tables)
    return ev["logloss"]


@pytest.mark.parametrize("algo", ["async", "shadow", "gba", "persia"])
def test_a_host_async_run_stops_at_the_eval_out_of_patience(tmp_path, monkeypatch, algo):
    # evals at 4, 8, 12, 16: best 0.7 at step 8, then 0.65 and 0.6: patience 2 runs out at 16
    _scripted(monkeypatch, [0.6, 0.7, 0.65, 0.6, 0.9, 0.9, 0.9, 0.9])
    cfg = _cfg(tmp_path, algo, early_stop_patience=2)
    summary = algorithms.run(cfg)
    assert (summary["steps"], summary["early_stopped"]) == (16, True)
    assert (summary["best_step"], summary["best_metric"]) == (8, 0.7)
    evals = _records(cfg, "eval")
    # the eval that stopped the run is the final one: not evaluated (and written) twice
    assert [e["step"] for e in evals] == [4, 8, 12, 16] and summary["eval_auc"] == 0.6
    assert summary["eval_logloss"] == evals[-1]["logloss"]
    # the Train NE counts the batches of the 16 steps, not those in flight when it stopped
    assert summary["train_examples_scored"] == 16 * 64
    assert sum(r.get("window_count", 0) for r in _records(cfg, "train")) == 16 * 64
    assert _records(cfg, "train")[-1]["step"] == 16
    monkeypatch.undo()
    # out/best/ holds what was evaluated at step 8; checkpoints/ the state at 16
    best = os.path.join(cfg.train.out, "best")
    assert Checkpointer(best).all_steps() == [8]
    assert _logloss_of_checkpoint(cfg, best, 8) == pytest.approx(evals[1]["logloss"], abs=1e-6)
    last = os.path.join(cfg.train.out, "checkpoints")
    assert _logloss_of_checkpoint(cfg, last, 16) == pytest.approx(evals[3]["logloss"], abs=1e-6)


@pytest.mark.parametrize("algo", ["async", "gba"])
def test_periodic_checkpoints_evaluate_at_each_interval_end_and_stop_there(tmp_path,
                                                                           monkeypatch, algo):
    # intervals of 8 steps; evals at 4, 8 (an interval's end), 12, 16 (an interval's end):
    # best at 4, patience 3 runs out at 16, an interval's end: the run ends there
    _scripted(monkeypatch, [0.8, 0.7, 0.7, 0.7, 0.9, 0.9, 0.9, 0.9])
    cfg = _cfg(tmp_path, algo, early_stop_patience=3, ckpt_every=8, keep_ckpts=4)
    summary = algorithms.run(cfg)
    assert (summary["steps"], summary["early_stopped"], summary["best_step"]) == (16, True, 4)
    assert [e["step"] for e in _records(cfg, "eval")] == [4, 8, 12, 16]
    # a train record at every log multiple, the intervals' ends included (they were skipped)
    assert [r["step"] for r in _records(cfg, "train")] == [4, 8, 12, 16]
    assert Checkpointer(os.path.join(cfg.train.out, "checkpoints")).all_steps() == [8, 16]
    assert Checkpointer(os.path.join(cfg.train.out, "best")).all_steps() == [4]


def test_keep_best_runs_to_the_end_and_counts_the_final_eval(tmp_path, monkeypatch):
    _scripted(monkeypatch, [0.6, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8])
    cfg = _cfg(tmp_path, "async", keep_best=True)
    summary = algorithms.run(cfg)
    assert (summary["steps"], summary["early_stopped"]) == (32, False)
    assert (summary["best_step"], summary["best_metric"]) == (32, 0.8)
    assert Checkpointer(os.path.join(cfg.train.out, "best")).all_steps() == [32]
    # its Train NE sums are the run's 32 steps, once (not the last call's twice)
    _, _, _, like = build(cfg, open_data(cfg).spec)
    best = Checkpointer(os.path.join(cfg.train.out, "best"))
    _, meta = best.restore(jax.tree.map(np.asarray, like), 32)
    best.close()
    assert meta["progress"]["totals"]["count"] == 32 * 64 == summary["train_examples_scored"]
