"""Dense learning-rate schedules (recjax/train/schedules.py) against their formulas, written
out in numpy, and inside the optimizer (SGD's update is -lr(t) * g)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from recjax import configs
from recjax.config import Config, ConfigError, DenseOptimConfig, apply_overrides
from recjax.train.features import check_features
from recjax.train.schedules import dense_schedule
from recjax.train.setup import make_dense_tx

LR, W, T, R, G = 0.2, 4, 10, 0.1, 0.5


def formula(kind: str, t: int) -> float:
    """lr(t) from the module docstring, by hand."""
    if t < W:
        return LR * t / W
    s = t - W
    if kind == "constant":
        return LR
    if kind == "cosine":
        return LR * (R + (1 - R) * (1 + math.cos(math.pi * min(s, T) / T)) / 2)
    if kind == "linear":
        return LR * (1 - (1 - R) * min(s, T) / T)
    if kind == "step":
        return LR * G ** (s // T)
    return LR * G ** (s / T)


@pytest.mark.parametrize("kind", ["constant", "cosine", "linear", "step", "exponential"])
def test_schedule_values_match_the_formula(kind):
    cfg = DenseOptimConfig(name="sgd", lr=LR, lr_schedule=kind, warmup_steps=W,
                           decay_steps=T, end_lr_ratio=R, decay_rate=G)
    sched = dense_schedule(cfg)
    for t in (0, 1, 3, 4, 5, 9, 14, 15, 23, 40):
        assert float(sched(t)) == pytest.approx(formula(kind, t), rel=1e-6, abs=1e-9), (kind, t)


def test_no_warmup_starts_at_lr_and_constant_is_a_float():
    assert dense_schedule(DenseOptimConfig(lr=0.3)) == 0.3  # today's optimizer, built as before
    cos = dense_schedule(DenseOptimConfig(lr=0.3, lr_schedule="cosine", decay_steps=8))
    assert float(cos(0)) == pytest.approx(0.3) and float(cos(8)) == pytest.approx(0.0, abs=1e-9)
    assert float(cos(4)) == pytest.approx(0.15, rel=1e-6)


def test_sgd_update_follows_the_schedule():
    """optax counts its own updates: update k moves params by -lr(k) * g."""
    tx = make_dense_tx(DenseOptimConfig(name="sgd", lr=LR, lr_schedule="cosine",
                                        warmup_steps=W, decay_steps=T, end_lr_ratio=R))
    params = {"w": jnp.zeros(3)}
    g = {"w": jnp.array([1.0, -2.0, 0.5])}
    state = tx.init(params)
    for k in range(8):
        upd, state = tx.update(g, state, params)
        np.testing.assert_allclose(np.asarray(upd["w"]), -formula("cosine", k) * np.asarray(g["w"]),
                                   rtol=1e-6, atol=1e-9)


def test_schedule_flags_and_their_errors():
    cfg = apply_overrides(Config(), [("dense.lr_schedule", "cosine"), ("dense.warmup_steps", "5"),
                                     ("dense.decay_steps", "100")])
    assert (cfg.dense.lr_schedule, cfg.dense.warmup_steps, cfg.dense.decay_steps) == ("cosine", 5, 100)
    with pytest.raises(ConfigError, match="dense.lr_schedule must be one of"):
        apply_overrides(Config(), [("dense.lr_schedule", "plateau")])
    with pytest.raises(ConfigError, match="decay_rate must be in"):
        apply_overrides(Config(), [("dense.decay_rate", "1.5")])
    no_t = apply_overrides(configs.smoke(), [("dense.lr_schedule", "step")])
    with pytest.raises(ValueError, match="needs dense.decay_steps > 0"):
        check_features(no_t)
