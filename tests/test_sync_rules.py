"""Sync rules: hand-computed updates and the limiting cases of STYLE.md rule 7 on a toy problem."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms import sync_rules as sr


def tree(x, y):
    return {"a": jnp.asarray(x, jnp.float32), "b": {"c": jnp.asarray(y, jnp.float32)}}


def close(t1, t2, tol=0.0):
    for x, y in zip(jax.tree.leaves(t1), jax.tree.leaves(t2)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def test_easgd_by_hand():
    # Alg. 2 in order: wPS = 1, w = 3, a = 0.25: wPS' = 0.75 + 0.75 = 1.5; w' = 0.75 * 3 +
    # 0.25 * 1.5 = 2.625 (the new wPS); leaf b: wPS' = [1, 3], w' = [3 + 0.25, 0.75]
    ps, w = sr.easgd(tree(1.0, [0.0, 4.0]), tree(3.0, [4.0, 0.0]), 0.25)
    close(ps, tree(1.5, [1.0, 3.0]))
    close(w, tree(2.625, [3.25, 0.75]))
    ps2, w2 = sr.SyncRule("easgd", 0.25).exchange(tree(1.0, [0.0, 4.0]), tree(3.0, [4.0, 0.0]))
    close(ps2, ps)
    close(w2, w)
    # simultaneous: w' = 0.75 * 3 + 0.25 * 1 = 2.5 (the old wPS); wPS' the same
    ps3, w3 = sr.SyncRule("easgd", 0.25, sequential=False).exchange(
        tree(1.0, [0.0, 4.0]), tree(3.0, [4.0, 0.0]))
    close(ps3, ps)
    close(w3, tree(2.5, [3.0, 1.0]))
    # a = 1: sequential copies w to the PS and keeps it; simultaneous swaps them
    ps, w = sr.easgd(tree(1.0, [0.0, 4.0]), tree(3.0, [4.0, 0.0]), 1.0)
    close(ps, tree(3.0, [4.0, 0.0]))
    close(w, tree(3.0, [4.0, 0.0]))
    ps, w = sr.easgd(tree(1.0, [0.0, 4.0]), tree(3.0, [4.0, 0.0]), 1.0, sequential=False)
    close(ps, tree(3.0, [4.0, 0.0]))
    close(w, tree(1.0, [0.0, 4.0]))


def test_the_config_picks_the_easgd_form():
    from algorithms.shadowsync import make_rule
    from recjax import configs

    cfg = configs.smoke()
    assert cfg.shadowsync.easgd_form == "sequential" and make_rule(cfg).sequential
    sim = dataclasses.replace(cfg, shadowsync=dataclasses.replace(cfg.shadowsync,
                                                                    easgd_form="simultaneous"))
    assert not make_rule(sim).sequential


def test_ma_and_bmuf_by_hand():
    ws = [tree(1.0, [0.0, 0.0]), tree(3.0, [2.0, 4.0])]
    mean = sr.tree_mean(ws)
    close(mean, tree(2.0, [1.0, 2.0]))
    close(sr.ma(ws[0], mean, 0.5), tree(1.5, [0.5, 1.0]))
    # g = 0, c = 2, eta = 0.5, mu = 0.5: d = 2, D = 0.5*0 + 1 = 1, g = 1; Nesterov target 1.5
    st = sr.BmufState(tree(0.0, [0.0, 0.0]), tree(0.0, [0.0, 0.0]))
    st, w = sr.bmuf(st, tree(2.0, [2.0, 2.0]), tree(4.0, [4.0, 4.0]), 1.0, 0.5, 0.5)
    close(st.g, tree(1.0, [1.0, 1.0]))
    close(w, tree(1.0, [1.0, 1.0]))
    # second block, c = 3: d = 2, D = 0.5 + 1 = 1.5, g = 2.5; Nesterov target 2.5 + 0.75
    st2, w2 = sr.bmuf(st, tree(3.0, [3.0, 3.0]), tree(0.0, [0.0, 0.0]), 0.5, 0.5, 0.5, True)
    close(st2.g, tree(2.5, [2.5, 2.5]))
    close(w2, tree(1.625, [1.625, 1.625]))


# --- limiting cases on a toy problem: n trainers doing SGD on their own quadratics ----------


def toy(n, steps, lr, sync):
    """Each trainer i minimises |w - t_i|^2 / 2 with SGD; `sync(ws, state)` after every step."""
    targets = [tree(float(i), [float(-i), 2.0 * i]) for i in range(n)]
    ws = [tree(0.5, [0.25, -0.5]) for _ in range(n)]
    state = None
    for _ in range(steps):
        ws = [jax.tree.map(lambda w, t: w - lr * (w - t), w, t) for w, t in zip(ws, targets)]
        ws, state = sync(ws, state)
    return ws


def test_easgd_alpha0_is_independent_local_sgd():
    def easgd0(ws, ps):
        ps = ws[0] if ps is None else ps
        out = []
        for w in ws:
            ps, w = sr.SyncRule("easgd", 0.0).exchange(ps, w)
            out.append(w)
        return out, ps

    close(toy(3, 20, 0.1, easgd0), toy(3, 20, 0.1, lambda ws, s: (ws, s)))  # bit for bit


def test_ma_every_step_alpha1_is_sync_sgd():
    rule = sr.SyncRule("ma", 1.0)

    def ma(ws, s):
        mean = rule.mean(ws)
        return [rule.local(None, mean, w)[1] for w in ws], s

    got = toy(4, 15, 0.1, ma)
    # sync SGD on the mean loss: w <- w - lr * mean_i (w - t_i)
    targets = [tree(float(i), [float(-i), 2.0 * i]) for i in range(4)]
    w = tree(0.5, [0.25, -0.5])
    for _ in range(15):
        g = sr.tree_mean([jax.tree.map(jnp.subtract, w, t) for t in targets])
        w = jax.tree.map(lambda x, gg: x - 0.1 * gg, w, g)
    for r in got:
        close(r, w, 1e-6)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.1])
def test_bmuf_eta1_momentum0_is_ma(alpha):
    ma_rule, bmuf_rule = sr.SyncRule("ma", alpha), sr.SyncRule("bmuf", alpha, eta=1.0, momentum=0.0)

    def ma(ws, s):
        mean = ma_rule.mean(ws)
        return [ma_rule.local(None, mean, w)[1] for w in ws], s

    def bmuf(ws, states):
        states = states or [sr.bmuf_init(tree(0.5, [0.25, -0.5]))] * len(ws)
        c = bmuf_rule.mean(ws)
        out = [bmuf_rule.local(st, c, w) for st, w in zip(states, ws)]
        return [w for _, w in out], [st for st, _ in out]

    for a, b in zip(toy(3, 25, 0.2, ma), toy(3, 25, 0.2, bmuf)):
        close(a, b, 1e-6)  # g + (c - g) rounds differently from c


def test_rule_validation():
    with pytest.raises(ValueError, match="unknown"):
        sr.SyncRule("gossip", 0.5)
    with pytest.raises(ValueError, match="alpha"):
        sr.SyncRule("ma", 1.5)
