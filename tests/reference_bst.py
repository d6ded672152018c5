"""BST (Chen et al. 2019) in float64 numpy with a hand-written backward, for
tests/reference_models.py (``reference("bst", ...)``).

Written from the paper, not from recjax/models/bst.py: example by example, the tokens are the
target and the example's *first len* behaviours only (no padding, so no mask: a padded position
simply is not there), each ``[item features, position embedding]``; per block (Sec. 2.2)

    head_c = softmax(X Wq_c (X Wk_c)^T / sqrt(d_h)) X Wv_c                     (Eq. 1, 3)
    S'     = LayerNorm(X + concat_c(head_c) Wo)                                (Eq. 2, 4)
    F      = LayerNorm(S' + LeakyReLU(S' W1 + b1) W2 + b2)                     (Eq. 5)

and the tower reads [other fields, the tokens' outputs in slots 0..L (absent ones zero), dense]
(Sec. 2.3). No dropout (the tests run the eval-mode forward).
"""

from __future__ import annotations

import numpy as np

LN_EPS = 1e-5
SLOPE = 0.01


def _layer_norm(x, p):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + LN_EPS)
    xhat = (x - mu) * inv

    def backward(dy):
        dxhat = dy * p["scale"]
        dx = inv * (dxhat - dxhat.mean(-1, keepdims=True)
                    - xhat * (dxhat * xhat).mean(-1, keepdims=True))
        return dx, {"scale": (dy * xhat).sum(0), "bias": dy.sum(0)}

    return xhat * p["scale"] + p["bias"], backward


def _block(p, x, heads):
    """One block over tokens x [T, d]; returns (F, backward(dF) -> (dx, grads))."""
    t, d = x.shape
    dh = d // heads
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    probs, o = [], np.zeros_like(x)
    for c in range(heads):
        sl = slice(c * dh, (c + 1) * dh)
        s = q[:, sl] @ k[:, sl].T / np.sqrt(dh)
        e = np.exp(s - s.max(1, keepdims=True))
        pr = e / e.sum(1, keepdims=True)
        probs.append(pr)
        o[:, sl] = pr @ v[:, sl]
    y1, ln1_bwd = _layer_norm(x + o @ p["wo"], p["ln1"])
    h1 = y1 @ p["ffn_0"]["kernel"] + p["ffn_0"]["bias"]
    a1 = np.where(h1 >= 0, h1, SLOPE * h1)
    y2, ln2_bwd = _layer_norm(y1 + a1 @ p["ffn_1"]["kernel"] + p["ffn_1"]["bias"], p["ln2"])

    def backward(dy2):
        g = {}
        dr2, g["ln2"] = ln2_bwd(dy2)
        g["ffn_1"] = {"kernel": a1.T @ dr2, "bias": dr2.sum(0)}
        dh1 = (dr2 @ p["ffn_1"]["kernel"].T) * np.where(h1 >= 0, 1.0, SLOPE)
        g["ffn_0"] = {"kernel": y1.T @ dh1, "bias": dh1.sum(0)}
        dr1, g["ln1"] = ln1_bwd(dr2 + dh1 @ p["ffn_0"]["kernel"].T)
        g["wo"] = o.T @ dr1
        do = dr1 @ p["wo"].T
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        for c in range(heads):
            sl, pr = slice(c * dh, (c + 1) * dh), probs[c]
            dv[:, sl] = pr.T @ do[:, sl]
            dp = do[:, sl] @ v[:, sl].T
            ds = pr * (dp - (dp * pr).sum(1, keepdims=True)) / np.sqrt(dh)
            dq[:, sl] = ds @ k[:, sl]
            dk[:, sl] = ds.T @ q[:, sl]
        g["wq"], g["wk"], g["wv"] = x.T @ dq, x.T @ dk, x.T @ dv
        dx = dr1 + dq @ p["wq"].T + dk @ p["wk"].T + dv @ p["wv"].T
        return dx, g

    return y2, backward


def bst(p, acts, dense, mlp, sequences=(), lengths=None, heads=1, **_):
    """Logits [B] and backward(d_logits) -> (g_params, g_acts). `mlp` is reference_models' MLP
    (forward, backward); `sequences` ``((positions, target), ...)``; `lengths` [B] each
    example's number of behaviours (default: all L); `heads` h."""
    emb = acts["emb"]
    b, n_fields, dim = emb.shape
    pos_f = [list(s[0]) for s in sequences]
    tgt_f = [s[1] for s in sequences]
    n_seq, big_l = len(pos_f), len(pos_f[0])
    lengths = np.full(b, big_l) if lengths is None else np.asarray(lengths)
    blocks = sorted((k for k in p if k.startswith("block_")), key=lambda k: int(k[6:]))
    has_pos = "pos" in p
    outs, backs = [], []
    for i in range(b):
        n = int(lengths[i])
        target = np.concatenate([emb[i, t] for t in tgt_f])  # [S * D]
        behaviours = np.concatenate([emb[i, f[:n]] for f in pos_f], axis=-1)  # [n, S * D]
        x = np.concatenate([target[None], behaviours], axis=0)  # token 0 = the target
        if has_pos:
            x = np.concatenate([x, p["pos"][: n + 1]], axis=1)
        chain = []
        for name in blocks:
            x, back = _block(p[name], x, heads)
            chain.append((name, back))
        slots = np.zeros((big_l + 1, x.shape[1]))
        slots[: n + 1] = x
        outs.append(slots.reshape(-1))
        backs.append(chain)
    used = {f for ps in pos_f for f in ps} | set(tgt_f)
    other = [f for f in range(n_fields) if f not in used]
    h = np.concatenate([emb[:, other].reshape(b, -1), np.stack(outs), dense], axis=1)
    deep = "deep" in p
    top, deep_bwd = mlp(p["deep"], h, last_linear=False) if deep else (h, None)
    logits = (top @ p["out"]["kernel"] + p["out"]["bias"])[:, 0]

    def backward(dl):
        g = {"out": {"kernel": top.T @ dl[:, None], "bias": dl.sum(keepdims=True)}}
        dh = dl[:, None] * p["out"]["kernel"][:, 0]
        if deep:
            g["deep"], dh = deep_bwd(dh)
        d_emb = np.zeros_like(emb)
        n_other = len(other) * dim
        d_emb[:, other] = dh[:, :n_other].reshape(b, len(other), dim)
        width = len(outs[0]) // (big_l + 1)
        d_tok = dh[:, n_other: n_other + len(outs[0])].reshape(b, big_l + 1, width)
        for name in blocks:
            g[name] = None
        if has_pos:
            g["pos"] = np.zeros_like(p["pos"])
        for i in range(b):
            n = int(lengths[i])
            dx = d_tok[i, : n + 1]
            for name, back in reversed(backs[i]):
                dx, gb = back(dx)
                g[name] = gb if g[name] is None else _add(g[name], gb)
            if has_pos:
                g["pos"][: n + 1] += dx[:, n_seq * dim:]
            for s in range(n_seq):
                cols = slice(s * dim, (s + 1) * dim)
                d_emb[i, tgt_f[s]] += dx[0, cols]
                d_emb[i, pos_f[s][:n]] += dx[1:, cols]
        return g, {"emb": d_emb}

    return logits, backward


def _add(a, b):
    if isinstance(a, dict):
        return {k: _add(a[k], b[k]) for k in a}
    return a + b
