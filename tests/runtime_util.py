"""Small configs and references shared by the host-async runtime tests."""

import dataclasses

import jax
import numpy as np

from recjax import configs
from recjax.config import DenseOptimConfig
from recjax.data.pipeline import batches
from recjax.data.synthetic import PRESETS, SyntheticSource
from recjax.embeddings import SparseOptimConfig
from recjax.models.config import ModelConfig
from recjax.train.setup import build
from recjax.train.step import jit_train_step


def small_cfg(algo: str, steps: int = 16, dense=("sgd", 0.1), sparse=("sgd", 0.05), train=None,
              **fields):
    """DLRM (smoke size) on 8K synthetic examples, B=64, deterministic unless told otherwise.

    Each keyword sets the field of that name in whichever of the ``runtime``, ``shadowsync``,
    ``gba`` and ``persia`` sections has it (the algorithm's own section when several do).
    """
    c = configs.smoke()
    sections = {s: {} for s in ("runtime", "shadowsync", "gba", "persia")}
    for key, value in fields.items():
        owner = [s for s in sections if key in {f.name for f in dataclasses.fields(getattr(c, s))}]
        if len(owner) > 1 and algo in owner:  # e.g. `mode`: the algorithm's own section
            owner = [algo]
        assert len(owner) == 1, f"no single config section has the field {key!r}"
        sections[owner[0]][key] = value
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS["smoke"], n_train=8192, n_eval=1024),
        model=ModelConfig.smoke("dlrm"),
        dense=DenseOptimConfig(name=dense[0], lr=dense[1]),
        sparse=SparseOptimConfig(name=sparse[0], lr=sparse[1]),
        data=dataclasses.replace(c.data, prefetch=2),
        train=dataclasses.replace(c.train, **{
            "algo": algo, "batch_size": 64, "steps": steps, "deterministic": True,
            "progress": False, "eval_batch_size": 1024, **(train or {})}),
        **{s: dataclasses.replace(getattr(c, s), **kw) for s, kw in sections.items()})


def worker_batches(cfg, worker: int, num_workers: int, n: int):
    src = SyntheticSource(cfg.synthetic)
    out = []
    for b, _ in batches(src, cfg.train.batch_size, seed=cfg.train.seed, epoch=0, shuffle_buffer=0,
                        drop_remainder=True, worker=worker, num_workers=num_workers):
        out.append(b)
        if len(out) == n:
            return out
    raise AssertionError("not enough data")


def reference(cfg, batch_list):
    """`train_step` (jitted, single device) over `batch_list` from the run's initial state."""
    model, tx, sopt, state = build(cfg, SyntheticSource(cfg.synthetic).spec)
    step = jit_train_step(model, tx, sopt)
    for b in batch_list:
        state, _ = step(state, b)
    return state


def assert_trees(a, b, rtol=0.0, atol=0.0):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def on_ray(cfg, **ray_fields):
    """`cfg` on the Ray backend (threads' timing: not deterministic)."""
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, deterministic=False),
        runtime=dataclasses.replace(cfg.runtime, backend="ray"),
        ray=dataclasses.replace(cfg.ray, **ray_fields))


def on_threads(cfg):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=False))
