"""Learning-rate schedules of the dense optimizer, built from optax schedules.

    lr(t) = lr * t / W                                   t < W (warm-up; W = warmup_steps)
    lr(t) = lr * f(t - W)                                t >= W
    cosine:      f(s) = r + (1 - r) * (1 + cos(pi * min(s, T) / T)) / 2
    linear:      f(s) = 1 - (1 - r) * min(s, T) / T
    step:        f(s) = g ** floor(s / T)
    exponential: f(s) = g ** (s / T)
    constant:    f(s) = 1

with T = decay_steps, r = end_lr_ratio, g = decay_rate. t counts the optimizer's own updates
(optax's ``count``), i.e. global steps for the single trainer and SPMD, each replica's updates
for a host-async trainer. The cosine form is Loshchilov & Hutter, "SGDR", ICLR 2017, Eq. 5
(one cycle, no restart); warm-up as Goyal et al., "Accurate, Large Minibatch SGD", 2017, Sec. 2.2
(gradual warm-up). FuxiCTR's default ``lr_scheduler`` (reduce on plateau) is not one of them.
"""

from __future__ import annotations

import optax


def dense_schedule(cfg) -> float | optax.Schedule:
    """The learning rate ``dense.lr`` under ``cfg.lr_schedule``: the float itself for a constant
    lr without warm-up (so today's optimizer is built exactly as before), else an optax schedule.

    Args:
      cfg: a `recjax.config.DenseOptimConfig`.
    """
    lr, kind, warm, t = cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.decay_steps
    if kind == "constant" and not warm:
        return lr
    if kind == "constant":
        after = optax.constant_schedule(lr)
    elif kind == "cosine":
        after = optax.cosine_decay_schedule(lr, t, alpha=cfg.end_lr_ratio)
    elif kind == "linear":
        after = optax.linear_schedule(lr, lr * cfg.end_lr_ratio, t)
    else:  # step / exponential
        after = optax.exponential_decay(lr, t, cfg.decay_rate, staircase=kind == "step")
    if not warm:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), after], [warm])
