"""Dropout and batch norm in the MLPs (model.dropout, model.batch_norm): training vs eval
behaviour against numpy, the train state's running averages, checkpoints, sync's per-shard
statistics, and the algorithms that must refuse them."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recjax import configs
from recjax.checkpoint import Checkpointer
from recjax.config import Config, apply_overrides
from recjax.models.config import ModelConfig
from recjax.models.ops import MLP
from recjax.train.loop import run
from recjax.train.setup import build, make_model
from recjax.train.step import DenseVars, eval_params, jit_predict, jit_train_step, step_rng
from tests.test_features_defaults import SPEC, _batch

EPS = 1e-5  # the batch norms' epsilon (PyTorch's)


def test_dropout_off_in_eval_and_unbiased_in_train():
    """Eval: the plain MLP exactly. Train: each unit is 0 with probability p, else h / (1 - p);
    the mean over many masks is h (the expectation that 1/(1-p) keeps)."""
    p, x = 0.3, jax.random.normal(jax.random.PRNGKey(1), (4, 5))
    plain = MLP((64,), last_linear=False)
    drop = MLP((64,), last_linear=False, dropout=p)
    params = plain.init(jax.random.PRNGKey(0), x)
    h = np.asarray(plain.apply(params, x))  # ReLU(x W + b): the pre-dropout units
    np.testing.assert_array_equal(np.asarray(drop.apply(params, x)), h)
    outs = np.stack([np.asarray(drop.apply(params, x, True, rngs={"dropout": jax.random.PRNGKey(k)}))
                     for k in range(400)])
    alive = h > 0
    kept = outs[:, alive] != 0
    np.testing.assert_allclose(outs[:, alive][kept], np.broadcast_to(h[alive] / (1 - p),
                                                                     outs[:, alive].shape)[kept],
                               rtol=1e-6)
    assert abs(1 - kept.mean() - p) < 0.01  # 400 * 150 Bernoulli draws: sd ~0.002
    np.testing.assert_allclose(outs.mean(0)[alive], h[alive], rtol=0.25)
    assert abs(outs.mean(0)[alive].sum() / h[alive].sum() - 1) < 0.02


def test_batch_norm_train_eval_and_running_averages_vs_numpy():
    m = 0.9
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (16, 5)) * 3 + 1)
    bn = MLP((6, 1), batch_norm=True, bn_momentum=m)
    v = bn.init(jax.random.PRNGKey(0), x)
    assert set(v) == {"params", "batch_stats"} and set(v["batch_stats"]) == {"bn_0"}  # not the output
    p = jax.tree.map(np.asarray, v["params"])
    k0, b0 = p["layer_0"]["kernel"], p["layer_0"]["bias"]
    k1, b1 = p["layer_1"]["kernel"], p["layer_1"]["bias"]
    scale, shift = np.asarray(p["bn_0"]["scale"]), np.asarray(p["bn_0"]["bias"])
    out, upd = bn.apply(v, x, True, mutable=["batch_stats"])
    z = x @ k0 + b0
    mu, var = z.mean(0), z.var(0)  # biased batch variance, as the normalisation uses
    want = np.maximum((z - mu) / np.sqrt(var + EPS) * scale + shift, 0) @ k1 + b1
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    run_mean, run_var = (1 - m) * mu, m * 1.0 + (1 - m) * var  # from mean 0, var 1
    np.testing.assert_allclose(np.asarray(upd["batch_stats"]["bn_0"]["mean"]), run_mean, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(upd["batch_stats"]["bn_0"]["var"]), run_var, rtol=1e-5)
    # eval: the running averages, not the batch's statistics
    ev = bn.apply({"params": v["params"], "batch_stats": upd["batch_stats"]}, x)
    want_ev = np.maximum((z - run_mean) / np.sqrt(run_var + EPS) * scale + shift, 0) @ k1 + b1
    np.testing.assert_allclose(np.asarray(ev), want_ev, rtol=1e-5, atol=1e-5)


def _cfg(**model):
    cfg = configs.smoke()
    return dataclasses.replace(cfg, model=dataclasses.replace(ModelConfig.smoke("deepfm"), **model))


def test_train_step_updates_batch_stats_and_draws_masks_per_step(tmp_path):
    cfg = _cfg(dropout=0.5, batch_norm=True)
    model, tx, sopt, state = build(cfg, SPEC)
    assert model.train_mode and set(state.batch_stats["deep"]) == {"bn_0", "bn_1"}
    step = jit_train_step(model, tx, sopt)
    batch = _batch(16)
    s0 = jax.tree.map(np.asarray, state)
    a, ma = step(jax.tree.map(jnp.asarray, s0), batch)
    b, mb = step(jax.tree.map(jnp.asarray, s0), batch)
    assert float(ma.loss) == float(mb.loss)  # masks are a function of (seed, step)
    c, mc = step(jax.tree.map(jnp.asarray, s0._replace(step=np.int32(1))), batch)
    assert float(mc.loss) != float(ma.loss)  # another step, other masks
    assert not np.array_equal(np.asarray(a.batch_stats["deep"]["bn_0"]["mean"]),
                              s0.batch_stats["deep"]["bn_0"]["mean"])
    # eval is deterministic and reads the running averages
    pred = jit_predict(model)
    ep = eval_params(a)
    assert isinstance(ep, DenseVars)
    p1 = np.asarray(pred(ep, a.tables, batch))
    np.testing.assert_array_equal(p1, np.asarray(pred(ep, a.tables, batch)))
    other = jax.tree.map(lambda x: x + 1.0, a.batch_stats)
    assert not np.allclose(p1, np.asarray(pred(DenseVars(a.params, other), a.tables, batch)))
    # the running averages are checkpointed and restored with the state
    ck = Checkpointer(str(tmp_path / "ck"), 1)
    ck.save(1, jax.tree.map(np.asarray, a), {})
    back, _ = ck.restore(jax.tree.map(np.asarray, s0))
    ck.close()
    for x, y in zip(jax.tree.leaves(a.batch_stats), jax.tree.leaves(back.batch_stats)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_step_rng_is_a_function_of_seed_and_step():
    k = [np.asarray(jax.random.key_data(step_rng(s, jnp.int32(t))))
         for s, t in ((0, 0), (0, 1), (1, 0), (0, 0))]
    assert not np.array_equal(k[0], k[1]) and not np.array_equal(k[0], k[2])
    np.testing.assert_array_equal(k[0], k[3])


def test_single_run_with_dropout_and_bn_trains_and_resumes_bitwise(tmp_path):
    """A run stopped at step 4 and resumed equals the uninterrupted run: the masks come from
    (seed, step) and the running averages from the checkpoint."""
    base = apply_overrides(configs.smoke(), [
        ("model.name", "dlrm"), ("model.dropout", "0.2"), ("model.batch_norm", "true"),
        ("train.steps", "8"), ("train.batch_size", "128"), ("train.progress", "false"),
        ("train.eval_batch_size", "1024")])
    base = dataclasses.replace(base, synthetic=dataclasses.replace(base.synthetic, n_train=4096,
                                                                   n_eval=1024))
    full = run(dataclasses.replace(base, train=dataclasses.replace(
        base.train, out=str(tmp_path / "a"))))
    part = dataclasses.replace(base, train=dataclasses.replace(base.train, out=str(tmp_path / "b"),
                                                               stop_after=4))
    run(part)
    resumed = run(dataclasses.replace(part, train=dataclasses.replace(part.train, stop_after=0,
                                                                      resume=True)))
    assert resumed["eval_auc"] == full["eval_auc"]
    assert resumed["train_ne"] == pytest.approx(full["train_ne"], rel=1e-6)  # sums' order differs
    fs, rs = full["final_state"], resumed["final_state"]
    for x, y in zip(jax.tree.leaves(fs), jax.tree.leaves(rs)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.isfinite(full["eval_auc"])


def test_sync_batch_norm_is_per_shard_and_averaged():
    """--algo sync on data=2: each shard normalises its own 8 rows; the running averages after
    one step are the mean over shards of m * old + (1 - m) * (shard mean / biased var) of the
    first hidden layer's pre-activations, computed here in numpy."""
    from algorithms.sync import SyncSetup, SyncStrategy
    from tests.test_sharding_helpers import tiny_cfg

    cfg = tiny_cfg("deepfm", mesh="data=2,model=1", sparse="sgd", batch=16)
    # dropout too: it follows bn_0's ReLU, so bn_0's statistics do not see it, but the step
    # takes the per-shard key path
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, batch_norm=True,
                                                             dropout=0.5),
                              train=dataclasses.replace(cfg.train, algo="sync"))
    model, tx, sopt, state = build(cfg, SPEC)
    setup = SyncSetup.from_config(cfg, 2, SPEC)
    strat = SyncStrategy(setup, model, tx, sopt)
    host = jax.tree.map(np.asarray, state)
    placed = strat.prepare(host)
    batch = _batch(16, seed=5)
    new, _ = strat.train_step(placed, strat.put_batch(batch))
    got = strat.unshard(new).batch_stats["deep"]["bn_0"]
    tabs = host.tables
    emb = np.stack([tabs[f"emb/{t}"][batch.ids[:, f, 0]] for f, t in enumerate(("ac", "b", "ac"))], 1)
    x0 = np.concatenate([emb.reshape(16, -1), batch.dense], 1)
    layer = host.params["deep"]["layer_0"]
    z = x0 @ layer["kernel"] + layer["bias"]
    m = cfg.model.bn_momentum
    halves = [z[:8], z[8:]]
    want_mean = np.mean([(1 - m) * h.mean(0) for h in halves], 0)
    want_var = np.mean([m + (1 - m) * h.var(0) for h in halves], 0)
    np.testing.assert_allclose(np.asarray(got["mean"]), want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got["var"]), want_var, rtol=1e-5, atol=1e-6)
    # the whole-batch variance differs: the statistics really are per shard
    assert not np.allclose(want_var, m + (1 - m) * z.var(0), rtol=1e-3)


@pytest.mark.parametrize("algo", ["des", "async", "shadow", "gba", "persia"])
def test_algorithms_without_a_training_forward_refuse(algo):
    cfg = apply_overrides(Config(), [("train.algo", algo), ("model.dropout", "0.1")])
    with pytest.raises(ValueError, match="model.dropout / model.batch_norm runs with --algo single or sync"):
        make_model(cfg, SPEC)


def test_refusals_lr_fm_and_microbatches():
    cfg = apply_overrides(Config(), [("model.name", "fm"), ("model.batch_norm", "true")])
    with pytest.raises(ValueError, match="has none"):
        make_model(cfg, SPEC)
    cfg = _cfg(batch_norm=True)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, microbatches=2))
    model, tx, sopt, state = build(cfg, SPEC)
    with pytest.raises(ValueError, match="needs the whole batch in one pass"):
        jit_train_step(model, tx, sopt)(state, _batch(16))


def test_dropout_with_microbatches_draws_a_mask_per_slice():
    """Dropout alone may be sliced: slice i's masks come from fold_in(key, i), so the two
    halves of a batch of twice the same rows drop different units."""
    cfg = _cfg(dropout=0.5)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, microbatches=2))
    model, tx, sopt, state = build(cfg, SPEC)
    half = _batch(8)
    batch = jax.tree.map(lambda x: np.concatenate([x, x]), half)
    from recjax.embeddings import lookup
    from recjax.train.step import loss_and_grads_train

    acts = lookup(model.layout, state.tables, batch.ids, batch.mask)
    (loss, logits), _, _ = jax.jit(lambda s, a, b: loss_and_grads_train(
        model, s.params, s.batch_stats, a, b, step_rng(0, jnp.int32(0))))(state, acts, batch)
    logits = np.asarray(logits)
    assert logits.shape == (16,) and np.isfinite(float(loss))
    assert not np.array_equal(logits[:8], logits[8:])
