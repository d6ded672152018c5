"""The single-device trainer: one full step vs numpy, loss falls, resume is bitwise, outputs."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax import configs
from recjax.batch import Batch
from recjax.config import DenseOptimConfig, TrainConfig
from recjax.data.synthetic import PRESETS, SyntheticSource
from recjax.embeddings import SparseOptimConfig
from recjax.features import FeatureSpec, FieldSpec
from recjax.models.config import MODEL_NAMES, ModelConfig
from recjax.train.loop import run
from recjax.train.setup import build
from recjax.train.step import jit_train_step, resolve_microbatches
from tests.reference_models import reference

LR_DENSE, LR_SPARSE = 0.1, 0.3


def _tiny_cfg(name, n_dense):
    cfg = configs.smoke()
    return dataclasses.replace(
        cfg, model=ModelConfig(name=name, embed_dim=3, bottom_mlp=(4,), top_mlp=(5,),
                               deep_mlp=(6, 4), cross_layers=2),
        dense=DenseOptimConfig(name="sgd", lr=LR_DENSE),
        sparse=SparseOptimConfig(name="sgd", lr=LR_SPARSE), embed=dataclasses.replace(cfg.embed, init="0.5"))


@pytest.mark.parametrize("n_dense", [2, 0])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_one_sgd_step_matches_numpy(name, n_dense):
    """Forward, dense update and embedding-row update of the jitted step vs a numpy backward.

    Fields 0 and 2 share a table and ids repeat, so a duplicate lost in the scatter fails.
    """
    spec = FeatureSpec(tuple(f"d{i}" for i in range(n_dense)),
                       (FieldSpec("a", 6, table="ac"), FieldSpec("b", 4), FieldSpec("c", 6, table="ac")))
    cfg = _tiny_cfg(name, n_dense)
    model, tx, sopt, state = build(cfg, spec)
    rng = np.random.default_rng(0)
    b = 7
    ids = np.stack([rng.integers(0, 6, b), rng.integers(0, 4, b), rng.integers(0, 6, b)], 1)
    ids = ids[:, :, None].astype(np.int32)
    batch = Batch(rng.normal(size=(b, n_dense)).astype(np.float32), ids, None,
                  (rng.random(b) < 0.5).astype(np.float32))
    tables0 = jax.tree.map(np.asarray, state.tables)
    params0 = jax.tree.map(np.asarray, state.params)
    acts = {g: np.stack([tables0[f"{g}/{('ac', 'b', 'ac')[f]}"][ids[:, f, 0]] for f in range(3)], 1)
            for g, _ in model.layout.groups}
    loss, _, g_params, g_acts = reference(name, params0, acts, batch.dense, batch.label)

    new, m = jit_train_step(model, tx, sopt)(state, batch)
    np.testing.assert_allclose(float(m.loss), loss, rtol=1e-5)
    want_params = jax.tree.map(lambda p, g: p - LR_DENSE * g, params0, g_params)
    for got, want in zip(jax.tree.leaves(new.params), jax.tree.leaves(want_params)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for g, _ in model.layout.groups:
        want = {k: v.astype(np.float64).copy() for k, v in tables0.items() if k.startswith(g + "/")}
        for f, t in enumerate(("ac", "b", "ac")):
            for i in range(b):
                want[f"{g}/{t}"][ids[i, f, 0]] -= LR_SPARSE * g_acts[g][i, f]
        for k, v in want.items():
            np.testing.assert_allclose(new.tables[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_loss_falls_on_synthetic(name):
    cfg = configs.smoke()
    cfg = dataclasses.replace(cfg, model=ModelConfig.smoke(name),
                              synthetic=dataclasses.replace(PRESETS["smoke"], n_train=20_000))
    src = SyntheticSource(cfg.synthetic)
    model, tx, sopt, state = build(cfg, src.spec)
    step = jit_train_step(model, tx, sopt)
    chunk = next(iter(src.chunks()))
    losses = []
    for i in range(60):
        s = slice((i % 70) * 256, (i % 70 + 1) * 256)
        state, m = step(state, Batch(chunk.dense[s], chunk.ids[s], None, chunk.label[s]))
        losses.append(float(m.loss))
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.02, losses


def _smoke(tmp_path, **train):
    cfg = configs.smoke()
    tc = dataclasses.replace(cfg.train, out=str(tmp_path), progress=False, **train)
    return dataclasses.replace(cfg, train=tc)


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves((state.params, state.opt_state, state.tables,
                                                    state.slots))]


def test_resume_is_bitwise(tmp_path):
    """Stop at step 37 (mid-epoch, off the checkpoint grid), resume, compare with a straight run."""
    straight = run(_smoke(tmp_path / "a", steps=90, ckpt_every=25))
    stopped = run(_smoke(tmp_path / "b", steps=90, ckpt_every=25, stop_after=37))
    assert stopped["stopped_at"] == 37
    resumed = run(_smoke(tmp_path / "b", steps=90, ckpt_every=25, resume=True))
    assert resumed["resumed_from_step"] == 37 and resumed["steps"] == 90
    for x, y in zip(_leaves(straight["final_state"]), _leaves(resumed["final_state"])):
        np.testing.assert_array_equal(x, y)
    assert straight["eval_ne"] == resumed["eval_ne"]


def test_outputs(tmp_path):
    s = run(_smoke(tmp_path, steps=30, save_predictions=True, log_every=10, tensorboard=True,
                   eval_every=20))
    summary = json.loads((tmp_path / "summary.json").read_text())
    for k in ("algorithm", "model", "dataset", "examples", "steps", "wall_seconds",
              "examples_per_sec", "train_ne", "eval_auc", "eval_logloss", "eval_ne",
              "bayes_eval_ne"):
        assert summary[k] is not None, k
    assert summary["steps"] == 30 and summary["examples"] == 30 * 256
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["kind"] == "train"] == [10, 20, 30]
    assert [r["step"] for r in lines if r["kind"] == "eval"] == [20, 30]
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tb"))
    preds = np.loadtxt(tmp_path / "predictions.csv", delimiter=",", skiprows=1)
    n_eval = PRESETS["smoke"].n_eval
    assert preds.shape == (n_eval, 2)
    ev = SyntheticSource(PRESETS["smoke"], "eval")
    np.testing.assert_array_equal(preds[:, 0], np.concatenate([c.label for c in ev.chunks()]))
    assert preds[:, 1].min() > 0 and preds[:, 1].max() < 1
    assert os.listdir(tmp_path / "checkpoints") == ["30"]
    assert abs(summary["eval_auc"] - s["eval_auc"]) < 1e-12


def test_resume_without_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        run(_smoke(tmp_path, steps=5, resume=True))


def test_jnp_state_is_donated():
    """The step donates the state: tables are updated in place, not copied."""
    cfg = configs.smoke()
    src = SyntheticSource(cfg.synthetic)
    model, tx, sopt, state = build(cfg, src.spec)
    chunk = next(iter(src.chunks()))
    batch = Batch(chunk.dense[:256], chunk.ids[:256], None, chunk.label[:256])
    old = state.tables["emb/C1"]
    step = jit_train_step(model, tx, sopt)
    new, _ = step(state, batch)
    assert old.is_deleted() and isinstance(new.tables["emb/C1"], jnp.ndarray)


def test_resolve_microbatches_auto():
    """0 = auto: the most >= 512-row slices dividing the batch on CPU, one pass elsewhere."""
    cpu = lambda b: resolve_microbatches(0, b, "cpu")  # noqa: E731
    assert [cpu(b) for b in (4096, 1024, 1000, 512, 256, 3000, 1536, 4100)] == [8, 2, 1, 1, 1, 5, 3, 5]
    assert resolve_microbatches(0, 65536, "gpu") == 1 and resolve_microbatches(0, 4096, "tpu") == 1
    assert resolve_microbatches(4, 4096, "gpu") == 4  # an explicit value is kept anywhere
    with pytest.raises(ValueError, match="microbatches=3 must divide"):
        TrainConfig(batch_size=1024, microbatches=3)
    with pytest.raises(ValueError, match="microbatches=-1"):
        TrainConfig(microbatches=-1)


@pytest.mark.parametrize("name", ["dlrm", "deepfm"])
def test_microbatched_step_equals_whole_batch(name):
    """train.microbatches only reorders float sums: same step to float32 rounding."""
    cfg = configs.smoke()
    cfg = dataclasses.replace(cfg, model=ModelConfig.smoke(name))
    src = SyntheticSource(cfg.synthetic)
    chunk = next(iter(src.chunks()))
    batch = Batch(chunk.dense[:256], chunk.ids[:256], None, chunk.label[:256])
    out = []
    for m in (1, 4):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, microbatches=m))
        model, tx, sopt, state = build(c, src.spec)
        assert model.microbatches == m
        step = jit_train_step(model, tx, sopt)
        for _ in range(2):
            state, metrics = step(state, batch)
        out.append((state, metrics))
    (s1, m1), (s4, m4) = out
    for f in m1._fields:  # the Train-NE sums pair each slice's logits with their labels
        np.testing.assert_allclose(getattr(m1, f), getattr(m4, f), rtol=1e-5, err_msg=f)
    for x, y in zip(_leaves(s1), _leaves(s4)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_resume_carries_train_ne_and_refuses_changed_config(tmp_path):
    straight = run(_smoke(tmp_path / "a", steps=60, log_every=7))
    run(_smoke(tmp_path / "b", steps=60, log_every=7, stop_after=25))
    with pytest.raises(ValueError, match="train.batch_size: checkpoint 256, now 128"):
        run(_smoke(tmp_path / "b", steps=60, batch_size=128, resume=True))
    resumed = run(_smoke(tmp_path / "b", steps=60, log_every=7, resume=True))
    assert resumed["train_examples_scored"] == straight["train_examples_scored"] == 60 * 256
    # the per-step sums are grouped differently around the checkpoint: float64 reassociation only
    assert resumed["train_ne"] == pytest.approx(straight["train_ne"], rel=1e-7)


def test_fresh_run_refuses_an_out_dir_with_checkpoints(tmp_path):
    run(_smoke(tmp_path, steps=5))
    with pytest.raises(ValueError, match="already holds checkpoints"):
        run(_smoke(tmp_path, steps=5))


def test_eval_against_the_teachers_probabilities(tmp_path):
    """On a synthetic teacher's eval split, eval_kl_to_bayes is the mean KL(p* || p) of the
    model's probabilities p (predictions.csv) against the teacher's true p* (scipy's rel_entr
    on probabilities, an independent formula), eval_excess_ne that over H(ctr), and on these
    rows the label-based gap eval_ne_gap_to_bayes is close to it (the labels' noise apart)."""
    from scipy.special import rel_entr

    run(_smoke(tmp_path, steps=30, save_predictions=True))
    summary = json.loads((tmp_path / "summary.json").read_text())
    preds = np.loadtxt(tmp_path / "predictions.csv", delimiter=",", skiprows=1)
    y, p_star = SyntheticSource(PRESETS["smoke"], "eval").labels_and_bayes_probs()
    np.testing.assert_array_equal(preds[:, 0], y)
    q = preds[:, 1]  # written with 7 significant digits
    kl = np.mean(rel_entr(p_star, q) + rel_entr(1 - p_star, 1 - q))
    assert summary["eval_kl_to_bayes"] == pytest.approx(kl, rel=1e-5)
    ctr = y.mean()
    h = -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
    assert summary["eval_excess_ne"] == pytest.approx(kl / h, rel=1e-5)
    assert summary["eval_excess_ne"] > 0
    assert abs(summary["eval_excess_ne"] - summary["eval_ne_gap_to_bayes"]) < 0.05
    evals = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["kl_to_bayes"] for r in evals if r["kind"] == "eval"][-1] == summary[
        "eval_kl_to_bayes"]
