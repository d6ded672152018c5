"""DCN-v2, DIN and BST training throughput against plain-JAX references written here.

    python -m recjax.tools.bench_models_seq [--quick] [--repeats 5]

Also a section of scripts/bench.py once its SECTIONS table names ``bench_models_seq``:
``bench_models_seq(repeats, quick) -> rows``.

For each model, interleaved repeat by repeat (algorithms/tools/bench.py `interleaved`'s manner):

* recjax's jitted train step (`recjax.train.step.jit_train_step`) on staged batches, SGD dense
  and sparse;
* a plain-JAX reference: gather rows per field, ``value_and_grad`` w.r.t. (params, rows), SGD on
  both, a donated ``table.at[ids].add``; the model written as a user would from the paper (DIN's
  activation unit on the concatenation ``[e, q, e - q, e * q]``, DCN-v2's ``x0 * (x W^T + b) +
  x``, BST's block of Eq. 1-5), no recjax code;
* the roofline: one large fp32 GEMM with a step's FLOPs (`bench_dlrm.make_peak_gemm`).

Shapes: DCN-v2 full rank, 3 cross layers, stacked with a 400-400 tower, on the 26 fields (D =
16, 13 dense) of the ``criteo_teacher`` preset; DIN (D = 16, unit 36, tower 200-80, the paper's
Fig. 2 sizes) and BST (D = 16, position embedding 8, so tokens of d = 40; 8 heads, 1 block,
feed-forward 160, tower 1024-512-256: Table 1's) on ``synthetic-seq`` (item and category
sequences of L = 20, mean length 10.5). B = 4096 (``--batch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from recjax import configs
from recjax.config import DenseOptimConfig
from recjax.data.pipeline import batches
from recjax.data.synthetic import PRESETS, SyntheticSource
from recjax.data.synthetic_seq import SeqTeacherConfig, SeqTeacherSource
from recjax.embeddings import SparseOptimConfig
from recjax.models import ModelConfig
from recjax.models.sequence import sequences
from recjax.tools import bench_dlrm
from recjax.train.setup import build
from recjax.train.step import jit_train_step

B, LR = 4096, 0.05
MODELS = ("dcn_v2", "din", "bst")


def _glorot(rng, a, b):
    return jnp.asarray(rng.normal(0, np.sqrt(2 / (a + b)), (a, b)), jnp.float32)


def _mlp_init(rng, sizes):
    return [(_glorot(rng, a, b), jnp.zeros((b,), jnp.float32)) for a, b in zip(sizes[:-1], sizes[1:])]


def _bce(logit, label):
    return jnp.mean(jax.nn.softplus(logit) - label * logit)


def _reference_step(loss, table_of: list[int]):
    """SGD step of `loss(params, emb[B, F, D], dense, label)` over tables[table_of[f]]."""

    def step(params, tables, dense, ids, mask, label):
        emb = jnp.stack([tables[t][ids[:, f]] for f, t in enumerate(table_of)], axis=1)
        emb = emb * mask[:, :, None]
        value, (gp, ge) = jax.value_and_grad(loss, argnums=(0, 1))(params, emb, dense, label)
        params = jax.tree.map(lambda p, g: p - LR * g, params, gp)
        ge = ge * mask[:, :, None]
        for t in range(len(tables)):
            fs = [f for f, tt in enumerate(table_of) if tt == t]
            tables[t] = tables[t].at[ids[:, fs].reshape(-1)].add(-LR * ge[:, fs].reshape(-1, ge.shape[-1]))
        return params, tables, value

    return jax.jit(step, donate_argnums=(0, 1))


def dcn_v2_reference(spec, dim: int, layers: int, deep, rng):
    k = spec.n_fields * dim + spec.n_dense
    params = {"w": [_glorot(rng, k, k) for _ in range(layers)],
              "b": [jnp.zeros((k,), jnp.float32) for _ in range(layers)],
              "deep": _mlp_init(rng, [k, *deep]), "out": _mlp_init(rng, [deep[-1], 1])}

    def loss(p, emb, dense, label):
        x0 = jnp.concatenate([emb.reshape(emb.shape[0], -1), dense], 1)
        x = x0
        for w, b in zip(p["w"], p["b"]):  # Eq. 1
            x = x0 * (x @ w.T + b) + x
        return _bce(bench_dlrm._mlp(p["out"], bench_dlrm._mlp(p["deep"], x, False), True)[:, 0], label)

    flops = 3 * 2 * (layers * k * k + sum(a * b for a, b in zip([k, *deep], [*deep, 1])))
    return params, loss, flops


def din_reference(spec, dim: int, att: int, deep, rng):
    seqs = sequences(spec)
    pos = [np.array(s.positions) for s in seqs]
    tgt = np.array([s.target for s in seqs])
    other = np.array([f for f in range(spec.n_fields) if f not in {int(i) for p in pos for i in p}])
    k = len(seqs) * dim
    tower_in = len(other) * dim + k + spec.n_dense
    params = {"att": _mlp_init(rng, [4 * k, att, 1]), "alpha": jnp.full((att,), 0.25),
              "deep": _mlp_init(rng, [tower_in, *deep]), "out": _mlp_init(rng, [deep[-1], 1])}

    def loss(p, emb, dense, label):
        e = jnp.concatenate([emb[:, i, :] for i in pos], -1)  # [B, L, K]
        q = jnp.broadcast_to(emb[:, tgt, :].reshape(emb.shape[0], 1, -1), e.shape)
        (w1, b1), (w2, b2) = p["att"]
        h = jnp.concatenate([e, q, e - q, e * q], -1) @ w1 + b1
        h = jnp.where(h > 0, h, p["alpha"] * h)
        v_u = jnp.einsum("bl,blk->bk", (h @ w2 + b2)[..., 0], e)  # Eq. 3
        x = jnp.concatenate([emb[:, other, :].reshape(emb.shape[0], -1), v_u, dense], 1)
        return _bce(bench_dlrm._mlp(p["out"], bench_dlrm._mlp(p["deep"], x, False), True)[:, 0], label)

    length = len(pos[0])
    flops = 3 * 2 * (length * (4 * k * att + att + k) + sum(
        a * b for a, b in zip([tower_in, *deep], [*deep, 1])))
    return params, loss, flops


def _layer_norm(x, p, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = jnp.square(x - mu).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def bst_reference(spec, dim: int, heads: int, pos_dim: int, deep, rng):
    """BST (Chen et al. 2019, Eq. 1-5) with one block and a feed-forward of 4 d."""
    seqs = sequences(spec)
    pos = [np.array(s.positions) for s in seqs]
    tgt = np.array([s.target for s in seqs])
    used = {int(i) for p in pos for i in p} | {int(t) for t in tgt}
    other = np.array([f for f in range(spec.n_fields) if f not in used], np.int64)
    t, d = len(pos[0]) + 1, len(seqs) * dim + pos_dim
    dh, f = d // heads, 4 * d
    tower_in = len(other) * dim + t * d + spec.n_dense
    def ln():
        return {"scale": jnp.ones((d,)), "bias": jnp.zeros((d,))}

    (w1, b1), (w2, b2) = _mlp_init(rng, [d, f, d])
    block = {**{n: _glorot(rng, d, d) for n in ("wq", "wk", "wv", "wo")}, "ln1": ln(), "ln2": ln(),
             "ffn_0": {"kernel": w1, "bias": b1}, "ffn_1": {"kernel": w2, "bias": b2}}
    params = {"pos": jnp.asarray(rng.normal(0, 0.05, (t, pos_dim)), jnp.float32), "block": block,
              "deep": _mlp_init(rng, [tower_in, *deep]), "out": _mlp_init(rng, [deep[-1], 1])}

    def loss(p, emb, dense, label):
        b, blk = emb.shape[0], p["block"]
        e = jnp.concatenate([emb[:, i, :] for i in pos], -1)  # behaviours [B, L, S * D]
        x = jnp.concatenate([emb[:, tgt, :].reshape(b, 1, -1), e], 1)  # the target first
        x = jnp.concatenate([x, jnp.broadcast_to(p["pos"], (b, t, pos_dim))], -1)
        valid = jnp.concatenate([jnp.ones((b, 1), bool), jnp.any(e != 0, -1)], 1)
        q, k, v = ((x @ blk[n]).reshape(b, t, heads, dh) for n in ("wq", "wk", "wv"))
        s = jnp.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(dh)  # Eq. 1
        s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
        att = jnp.einsum("bhqk,bkhc->bqhc", jax.nn.softmax(s, -1), v).reshape(b, t, d)
        x = _layer_norm(x + att @ blk["wo"], blk["ln1"])  # Eq. 2, 4
        ffn = jax.nn.leaky_relu(x @ blk["ffn_0"]["kernel"] + blk["ffn_0"]["bias"], 0.01)
        x = _layer_norm(x + ffn @ blk["ffn_1"]["kernel"] + blk["ffn_1"]["bias"], blk["ln2"])
        x = (x * valid[..., None]).reshape(b, -1)  # Eq. 5, padding zeroed
        h = jnp.concatenate([emb[:, other, :].reshape(b, -1), x, dense], 1)
        return _bce(bench_dlrm._mlp(p["out"], bench_dlrm._mlp(p["deep"], h, False), True)[:, 0], label)

    flops = 3 * 2 * (t * (4 * d * d + 2 * d * f) + 2 * t * t * d + sum(
        a * b for a, b in zip([tower_in, *deep], [*deep, 1])))
    return params, loss, flops


def _case(name: str, quick: bool, b: int = B):
    cfg = configs.smoke()
    sgd = dict(dense=DenseOptimConfig(name="sgd", lr=LR), sparse=SparseOptimConfig(name="sgd", lr=LR))
    rng = np.random.default_rng(0)
    if name == "dcn_v2":
        src = SyntheticSource(dataclasses.replace(PRESETS["criteo_teacher"], n_train=8 * b))
        model = ModelConfig(name="dcn_v2", embed_dim=16, deep_mlp=(400, 400), cross_layers=3)
        params, loss, flops = dcn_v2_reference(src.spec, 16, 3, (400, 400), rng)
    elif name == "din":
        src = SeqTeacherSource(SeqTeacherConfig(n=8 * b))
        model = ModelConfig(name="din", embed_dim=16, att_mlp=(36,), deep_mlp=(200, 80))
        params, loss, flops = din_reference(src.spec, 16, 36, (200, 80), rng)
    else:
        src = SeqTeacherSource(SeqTeacherConfig(n=8 * b))
        model = ModelConfig(name="bst", embed_dim=16, bst_heads=8, bst_pos_dim=8,
                            deep_mlp=(1024, 512, 256))
        params, loss, flops = bst_reference(src.spec, 16, 8, 8, (1024, 512, 256), rng)
    cfg = dataclasses.replace(cfg, model=model, **sgd,
                              train=dataclasses.replace(cfg.train, batch_size=b, microbatches=1))
    staged = [b for b, _ in itertools.islice(
        batches(src, b, seed=0, epoch=0, shuffle_buffer=0, drop_remainder=True), 2 if quick else 4)]
    m, tx, sopt, state = build(cfg, src.spec)
    ours = jit_train_step(m, tx, sopt)
    names = list(dict.fromkeys(f.table for f in src.spec.fields))
    table_of = [names.index(f.table) for f in src.spec.fields]
    tables = [jnp.array(np.asarray(state.tables[f"emb/{t}"])) for t in names]  # own copies
    ref = _reference_step(loss, table_of)
    dev = [jax.device_put(b) for b in staged]
    flat = [(b.dense, b.ids[:, :, 0], (b.mask[:, :, 0] if b.mask is not None
                                       else np.ones(b.ids.shape[:2], np.float32)), b.label)
            for b in staged]
    box = {"ours": state, "ref": (params, tables)}

    def run_ours(n):
        s = box["ours"]
        for i in range(n):
            s, met = ours(s, dev[i % len(dev)])
        jax.block_until_ready(met.loss)
        box["ours"] = s

    def run_ref(n):
        p, t = box["ref"]
        for i in range(n):
            p, t, value = ref(p, t, *flat[i % len(flat)])
        jax.block_until_ready(value)
        box["ref"] = (p, t)

    peak, _ = bench_dlrm.make_peak_gemm(b, flops)
    return {"recjax, staged batches": run_ours, "plain-JAX reference": run_ref,
            "peak fp32 GEMM, a step's FLOPs (roofline)": peak}, flops


def bench_models_seq(repeats: int, quick: bool, batch: int = B) -> list[dict]:
    steps = 3 if quick else 8
    rows = []
    for name in MODELS:
        runners, flops = _case(name, quick, batch)
        for run in runners.values():
            run(2)
        rates = {k: [] for k in runners}
        for _ in range(repeats):
            for k, run in runners.items():
                t0 = time.perf_counter()
                run(steps)
                rates[k].append(steps * batch / (time.perf_counter() - t0))
        ref = np.median(rates["plain-JAX reference"])
        peak = np.median(rates["peak fp32 GEMM, a step's FLOPs (roofline)"])
        for k, v in rates.items():
            med = float(np.median(v))
            rows.append({"section": "models_seq", "model": name, "name": f"{name}: {k}",
                         "batch_size": batch, "median": med, "examples_per_sec": v,
                         "ratio_to_reference": med / ref, "ratio_to_roofline": med / peak,
                         "gflops": med * flops / 1e9, "flops_per_example": flops,
                         "repeats": repeats, "steps_per_repeat": steps})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=B)
    args = p.parse_args(argv)
    print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores, load {os.getloadavg()}")
    for r in bench_models_seq(args.repeats, args.quick, args.batch):
        print(f"  {r['name']:52s} {r['median']:10,.0f} ex/s  x{r['ratio_to_reference']:.2f} of "
              f"reference  {r['ratio_to_roofline']:.3f} of roofline  {r['gflops']:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
