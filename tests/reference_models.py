"""Hand-written numpy forward and backward passes of every model, in float64.

An independent reference for the Flax models and for the trainers built on them: no JAX and no
autodiff, every gradient written out by the chain rule. ``reference(...)`` returns the loss, the
logits, and the gradients w.r.t. the dense parameters and the activation groups, so a test of
"one SGD step of the trainer matches numpy" needs only

    loss, logits, g_params, g_acts = reference(name, params, acts, dense, labels)
    new_params = tree_map(lambda p, g: p - lr * g, params, g_params)
    new_rows   = rows - lr * (g_acts scattered to the looked-up ids)

Parameter trees are the Flax trees (``variables["params"]``, or the whole ``{"params": ...}``
dict, returned in the same shape) with numpy or JAX leaves. Names follow ``recjax.models``:
MLPs are ``{"layer_i": {"kernel": [in, out], "bias": [out]}}``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.reference_bst import bst as _bst_with

Tree = dict
Backward = Callable[[np.ndarray], tuple[Tree, dict[str, np.ndarray]]]


def _f64(tree):
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return np.asarray(tree, np.float64)


# ---- building blocks: each forward returns (output, backward(d_output) -> grads) ------------


def _mlp(p: Tree, x: np.ndarray, last_linear: bool):
    """Dense layers ``layer_0..layer_{n-1}``, ReLU after each except a linear last layer."""
    n = len(p)
    cache = []
    for i in range(n):
        layer = p[f"layer_{i}"]
        h = x @ layer["kernel"] + layer["bias"]
        relu = i < n - 1 or not last_linear
        cache.append((x, h, relu))
        x = np.maximum(h, 0.0) if relu else h

    def backward(dy):
        grads = {}
        for i in reversed(range(n)):
            x_in, h, relu = cache[i]
            if relu:
                dy = dy * (h > 0)  # ReLU'(0) = 0, as in JAX
            grads[f"layer_{i}"] = {"kernel": x_in.T @ dy, "bias": dy.sum(0)}
            dy = dy @ p[f"layer_{i}"]["kernel"].T
        return grads, dy

    return x, backward


def _first_order(wide):
    """sum over fields of [B, F, 1]; d/d wide = d_out broadcast to every field."""
    return wide.sum(axis=(1, 2)), lambda d: np.broadcast_to(d[:, None, None], wide.shape).copy()


def _fm2(emb):
    """0.5 * sum_d((sum_f v)^2 - sum_f v^2); d/d v_f = d_out * (sum_g v_g - v_f)."""
    s = emb.sum(1)
    out = 0.5 * ((s * s).sum(-1) - (emb * emb).sum((1, 2)))
    return out, lambda d: d[:, None, None] * (s[:, None, :] - emb)


def _dot_interaction(v, self_pairs):
    """Upper triangle (row-major) of Z = V V^T; dV = (dZ + dZ^T) V with dZ zero off the pairs."""
    n = v.shape[1]
    i, j = np.triu_indices(n, k=0 if self_pairs else 1)
    z = np.einsum("bnd,bmd->bnm", v, v)

    def backward(dz_pairs):
        dz = np.zeros_like(z)
        dz[:, i, j] = dz_pairs
        return np.einsum("bnm,bmd->bnd", dz + dz.transpose(0, 2, 1), v)

    return z[:, i, j], backward


def _dense_linear(p, dense):
    """dense @ dense_w (no parameter without dense features)."""
    if "dense_w" not in p:
        return np.zeros(dense.shape[0]), lambda d: {}
    return dense @ p["dense_w"], lambda d: {"dense_w": dense.T @ d}


def _flatten(emb, dense):
    return np.concatenate([emb.reshape(emb.shape[0], -1), dense], axis=1)


# ---- models: (params, acts, dense) -> (logits, backward(d_logits) -> (g_params, g_acts)) ----


def _lr(p, acts, dense, **_):
    fo, fo_bwd = _first_order(acts["wide"])
    lin, lin_bwd = _dense_linear(p, dense)

    def backward(d):
        return {"bias": d.sum(), **lin_bwd(d)}, {"wide": fo_bwd(d)}

    return p["bias"] + fo + lin, backward


def _fm(p, acts, dense, **_):
    lr_out, lr_bwd = _lr(p, acts, dense)
    so, so_bwd = _fm2(acts["emb"])

    def backward(d):
        g, g_acts = lr_bwd(d)
        return g, {**g_acts, "emb": so_bwd(d)}

    return lr_out + so, backward


def _wide_deep(p, acts, dense, fm_term=False, **_):
    emb = acts["emb"]
    fo, fo_bwd = _first_order(acts["wide"])
    lin, lin_bwd = _dense_linear(p, dense)
    deep, deep_bwd = _mlp(p["deep"], _flatten(emb, dense), last_linear=True)
    logits = fo + lin + deep[:, 0]
    if fm_term:
        so, so_bwd = _fm2(emb)
        logits = logits + so

    def backward(d):
        g_deep, dx0 = deep_bwd(d[:, None])
        d_emb = dx0[:, : emb[0].size].reshape(emb.shape)
        if fm_term:
            d_emb = d_emb + so_bwd(d)
        return {**lin_bwd(d), "deep": g_deep}, {"wide": fo_bwd(d), "emb": d_emb}

    return logits, backward


def _deepfm(p, acts, dense, **_):
    return _wide_deep(p, acts, dense, fm_term=True)


def _dlrm(p, acts, dense, interaction_self=False, **_):
    emb = acts["emb"]
    d_model = emb.shape[2]
    has_bottom = "bottom" in p
    if has_bottom:
        x, bottom_bwd = _mlp(p["bottom"], dense, last_linear=False)
        vectors = np.concatenate([x[:, None, :], emb], axis=1)
    else:
        vectors = emb
    z, z_bwd = _dot_interaction(vectors, interaction_self)
    top_in = np.concatenate([x, z], axis=1) if has_bottom else z
    y, top_bwd = _mlp(p["top"], top_in, last_linear=True)

    def backward(d):
        g = {}
        g["top"], d_in = top_bwd(d[:, None])
        dz = d_in[:, d_model:] if has_bottom else d_in
        d_vectors = z_bwd(dz)
        if not has_bottom:
            return g, {"emb": d_vectors}
        dx = d_in[:, :d_model] + d_vectors[:, 0]  # x feeds both the top MLP and the interaction
        g["bottom"], _ = bottom_bwd(dx)
        return g, {"emb": d_vectors[:, 1:]}

    return y[:, 0], backward


def _dcn(p, acts, dense, **_):
    emb = acts["emb"]
    x0 = _flatten(emb, dense)
    k = x0.shape[1]
    w, b = p["cross_w"], p["cross_b"]
    x, cache = x0, []
    for layer in range(w.shape[0]):  # x_{l+1} = x0 (x_l . w_l) + b_l + x_l
        s = x @ w[layer]
        cache.append((x, s))
        x = x0 * s[:, None] + b[layer] + x
    parts = [x]
    if "deep" in p:
        h, deep_bwd = _mlp(p["deep"], x0, last_linear=False)
        parts.append(h)
    hcat = np.concatenate(parts, axis=1)
    logits = (hcat @ p["out"]["kernel"] + p["out"]["bias"])[:, 0]

    def backward(d):
        g = {"out": {"kernel": hcat.T @ d[:, None], "bias": d.sum(keepdims=True)}}
        d_h = d[:, None] * p["out"]["kernel"][:, 0]
        dx = d_h[:, :k]
        dx0 = np.zeros_like(x0)
        if "deep" in p:
            g["deep"], dx0 = deep_bwd(d_h[:, k:])
        gw, gb = np.zeros_like(w), np.zeros_like(b)
        for layer in reversed(range(w.shape[0])):
            x_l, s = cache[layer]
            dx0 = dx0 + dx * s[:, None]
            ds = (dx * x0).sum(1)
            gw[layer] = x_l.T @ ds
            gb[layer] = dx.sum(0)
            dx = dx + ds[:, None] * w[layer]
        dx0 = dx0 + dx  # x_0 of the cross network is x0 itself
        g["cross_w"], g["cross_b"] = gw, gb
        return g, {"emb": dx0[:, : emb[0].size].reshape(emb.shape)}

    return logits, backward


def _dcn_v2(p, acts, dense, **_):
    """DCN-v2 (Wang et al. 2021), full-rank (Eq. 1) or low-rank cross layers, one expert,
    stacked or parallel (told apart by the out layer's width); the mixture's backward is not
    written here (tests/test_models_dcn_v2.py checks its forward)."""
    if "cross_c" in p:
        raise NotImplementedError("the DCN-v2 mixture has a forward reference only")
    emb = acts["emb"]
    x0 = _flatten(emb, dense)
    k = x0.shape[1]
    b = p["cross_b"]
    full = "cross_w" in p
    x, cache = x0, []
    for layer in range(b.shape[0]):  # x_{l+1} = x0 * (W_l x_l + b_l) + x_l, W = U V^T (low rank)
        if full:
            t = None
            z = x @ p["cross_w"][layer].T + b[layer]
        else:
            t = x @ p["cross_v"][layer, 0]
            z = t @ p["cross_u"][layer, 0].T + b[layer]
        cache.append((x, t, z))
        x = x0 * z + x
    deep = "deep" in p
    parallel = p["out"]["kernel"].shape[0] != (
        p["deep"][f"layer_{len(p['deep']) - 1}"]["kernel"].shape[1] if deep else k)
    if deep:
        h, deep_bwd = _mlp(p["deep"], x0 if parallel else x, last_linear=False)
        top = np.concatenate([x, h], axis=1) if parallel else h
    else:
        top = x
    logits = (top @ p["out"]["kernel"] + p["out"]["bias"])[:, 0]

    def backward(d):
        g = {"out": {"kernel": top.T @ d[:, None], "bias": d.sum(keepdims=True)}}
        d_top = d[:, None] * p["out"]["kernel"][:, 0]
        dx0 = np.zeros_like(x0)
        if deep and parallel:
            g["deep"], dx0 = deep_bwd(d_top[:, k:])
            dx = d_top[:, :k]
        elif deep:
            g["deep"], dx = deep_bwd(d_top)
        else:
            dx = d_top
        gb = np.zeros_like(b)
        gw = np.zeros_like(p["cross_w"]) if full else None
        gu = None if full else np.zeros_like(p["cross_u"])
        gv = None if full else np.zeros_like(p["cross_v"])
        for layer in reversed(range(b.shape[0])):
            x_l, t, z = cache[layer]
            dx0 = dx0 + dx * z
            dz = dx * x0
            gb[layer] = dz.sum(0)
            if full:
                gw[layer] = dz.T @ x_l
                dx = dx + dz @ p["cross_w"][layer]
            else:
                gu[layer, 0] = dz.T @ t
                dt = dz @ p["cross_u"][layer, 0]
                gv[layer, 0] = x_l.T @ dt
                dx = dx + dt @ p["cross_v"][layer, 0].T
        dx0 = dx0 + dx  # x_0 of the cross network is x0 itself
        g["cross_b"] = gb
        if full:
            g["cross_w"] = gw
        else:
            g["cross_u"], g["cross_v"] = gu, gv
        return g, {"emb": dx0[:, : emb[0].size].reshape(emb.shape)}

    return logits, backward


def _din(p, acts, dense, sequences=(), **_):
    """DIN (Zhou et al. 2018, Eq. 3, Fig. 2): ``v_U = sum_j a(e_j, v_A) e_j`` with the activation
    unit an MLP over the concatenation ``[e_j, v_A, e_j - v_A, e_j * v_A]`` (PReLU hidden layers,
    no softmax); then ``[other fields, v_U, dense] -> tower -> logit``. Sum pooling (every weight
    1) when ``p`` has no ``att``. `sequences`: ``((positions, target), ...)`` field indices."""
    emb = acts["emb"]
    b, n_fields, d = emb.shape
    pos = [np.asarray(s[0], dtype=np.int64) for s in sequences]
    tgt = [s[1] for s in sequences]
    e = np.concatenate([emb[:, ix, :] for ix in pos], axis=-1)  # [B, L, K]
    q = np.concatenate([emb[:, t, :] for t in tgt], axis=-1)  # [B, K]
    k = e.shape[-1]
    qb = np.broadcast_to(q[:, None, :], e.shape)
    att = p.get("att")
    if att is not None:
        n = sum(name.startswith("layer_") for name in att)
        z, cache = np.concatenate([e, qb, e - qb, e * qb], axis=-1), []
        for i in range(n):
            h = z @ att[f"layer_{i}"]["kernel"] + att[f"layer_{i}"]["bias"]
            cache.append((z, h))
            if i < n - 1:
                alpha = att[f"prelu_{i}"]
                z = np.where(h > 0, h, alpha * h)
        w = h[..., 0]  # [B, L]
    else:
        w = np.ones(e.shape[:2])
    v_u = np.einsum("bl,blk->bk", w, e)
    seq_fields = {int(f) for ix in pos for f in ix}
    other = [f for f in range(n_fields) if f not in seq_fields]
    x = np.concatenate([emb[:, other, :].reshape(b, -1), v_u, dense], axis=1)
    deep = "deep" in p
    top, deep_bwd = _mlp(p["deep"], x, last_linear=False) if deep else (x, None)
    logits = (top @ p["out"]["kernel"] + p["out"]["bias"])[:, 0]

    def backward(dl):
        g = {"out": {"kernel": top.T @ dl[:, None], "bias": dl.sum(keepdims=True)}}
        dx = dl[:, None] * p["out"]["kernel"][:, 0]
        if deep:
            g["deep"], dx = deep_bwd(dx)
        d_emb = np.zeros_like(emb)
        d_emb[:, other, :] = dx[:, : len(other) * d].reshape(b, len(other), d)
        dv = dx[:, len(other) * d: len(other) * d + k]
        de = w[..., None] * dv[:, None, :]  # d v_U / d e_j = w_j
        dq = np.zeros_like(q)
        if att is not None:
            dh = np.einsum("bk,blk->bl", dv, e)[..., None]  # d v_U / d w_j = e_j
            ga = {}
            for i in reversed(range(n)):
                z_in, h = cache[i]
                if i < n - 1:
                    alpha = att[f"prelu_{i}"]
                    ga[f"prelu_{i}"] = (dh * np.where(h > 0, 0.0, h)).sum((0, 1))
                    dh = dh * np.where(h > 0, 1.0, alpha)
                ga[f"layer_{i}"] = {"kernel": np.einsum("bli,blo->io", z_in, dh),
                                    "bias": dh.sum((0, 1))}
                dh = dh @ att[f"layer_{i}"]["kernel"].T
            dz = dh  # [B, L, 4K] for [e, v_A, e - v_A, e * v_A]
            de = de + dz[..., :k] + dz[..., 2 * k: 3 * k] + dz[..., 3 * k:] * qb
            dq = (dz[..., k: 2 * k] - dz[..., 2 * k: 3 * k] + dz[..., 3 * k:] * e).sum(1)
            g["att"] = ga
        for s, (ix, t) in enumerate(zip(pos, tgt)):
            d_emb[:, ix, :] += de[..., s * d: (s + 1) * d]
            d_emb[:, t, :] += dq[:, s * d: (s + 1) * d]
        return g, {"emb": d_emb}

    return logits, backward


def _bst(p, acts, dense, **kw):
    """BST (Chen et al. 2019): tests/reference_bst.py, with this module's MLP."""
    return _bst_with(p, acts, dense, _mlp, **kw)


_FORWARD = {"lr": _lr, "fm": _fm, "wide_deep": _wide_deep, "deepfm": _deepfm, "dlrm": _dlrm,
            "dcn": _dcn, "dcn_v2": _dcn_v2, "din": _din, "bst": _bst}


def bce(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean sigmoid cross entropy and its gradient ``(sigmoid(x) - y) / B`` w.r.t. the logits."""
    per = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    sig = np.exp(-np.logaddexp(0.0, -logits))  # sigmoid without overflow
    return float(per.mean()), (sig - labels) / logits.shape[0]


def reference(model_name: str, params: Tree, acts: dict, dense, labels, *,
              interaction_self: bool = False, sequences: tuple = (), **model_kw):
    """Loss, logits and gradients of ``bce_loss(model(params, acts, dense), labels)``.

    Args:
      model_name: one of ``lr, fm, wide_deep, deepfm, dlrm, dcn, dcn_v2, din, bst``.
      params: the Flax parameter tree (``variables["params"]`` or ``{"params": ...}``).
      acts: activation groups, ``{"emb": [B, F, D], "wide": [B, F, 1]}`` (those the model reads;
        any other group gets a zero gradient).
      dense: [B, n_dense] (n_dense may be 0).
      labels: [B] in [0, 1].
      interaction_self: DLRM's ``interaction_self`` (not recoverable from the parameters).
      sequences: DIN's ``((position field indices, target field index), ...)``, one per
        behaviour sequence (`recjax.models.sequence.sequences` of the spec).
      model_kw: BST's ``heads`` (h) and ``lengths`` ([B] behaviours per example; default all).

    Returns:
      ``(loss, logits, grad_params, grad_acts)`` in float64: a float, [B], a tree shaped like
      ``params``, and a dict shaped like ``acts``.
    """
    wrapped = set(params) == {"params"}
    p = _f64(params["params"] if wrapped else params)
    acts64 = {k: np.asarray(v, np.float64) for k, v in acts.items()}
    dense = np.asarray(dense, np.float64)
    labels = np.asarray(labels, np.float64)
    logits, backward = _FORWARD[model_name](p, acts64, dense, interaction_self=interaction_self,
                                            sequences=sequences, **model_kw)
    loss, d_logits = bce(logits, labels)
    g_params, g_acts = backward(d_logits)
    g_acts = {k: g_acts.get(k, np.zeros_like(v)) for k, v in acts64.items()}
    return loss, logits, ({"params": g_params} if wrapped else g_params), g_acts
