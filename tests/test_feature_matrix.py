"""Every algorithm x every run feature (issue 34): early stopping, keep_best, eval_every,
TensorBoard, an LR schedule, periodic checkpoints + resume. Each cell works, or is refused
with the reason the registry gives (`registry.check`); the algorithms come from the registry,
so a new row is in the matrix without an edit here.

The checks are independent of the code under test: the evals' AUCs are scripted (the stopping
step and the best step follow by hand); TensorBoard's event files are read back as TFRecords
and their eval steps compared with metrics.jsonl's; a warm-up longer than the run must keep the
dense parameters within the bound sum_t lr_t of their start (Adam moves a parameter by at most
~lr_t per step), which a constant learning rate exceeds 100-fold; a run stopped at a checkpoint
and resumed must end bitwise where the uninterrupted run ends.
"""

import dataclasses
import json
import os
import struct

import jax
import numpy as np
import pytest

import algorithms
from recjax import registry
from recjax.checkpoint import Checkpointer
from recjax.config import DenseOptimConfig
from recjax.data.synthetic import SyntheticSource
from recjax.models.config import ModelConfig
from recjax.train.setup import build
from tests.runtime_util import assert_trees, small_cfg
from tests.test_features_early_stop import _scripted

pytestmark = pytest.mark.slow  # ~45 short runs: make test-all

ALGOS = registry.NAMES


def _cfg(tmp_path, algo, name="run", dense=("adam", 1e-3), **train):
    cfg = small_cfg(algo, steps=24, dense=dense, train={"out": str(tmp_path / name), **train})
    if registry.REGISTRY[algo].kind == registry.SPMD:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, devices=2))
    if algo == "des":  # DES has no substitution for DLRM's interaction (sharding/des.py)
        cfg = dataclasses.replace(cfg, model=ModelConfig.smoke("deepfm"))
    return cfg


def _tfrecord_steps(directory: str, tag: str) -> list[int]:
    """The steps of `tag`'s scalars in the TensorBoard event files under `directory` (read as
    TFRecords: length, crc, an Event proto, crc)."""
    from tensorboardX.proto import event_pb2

    steps = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + n])
            at += 12 + n + 4
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return steps


def _capable(algo: str, capability: str) -> bool:
    return capability in registry.REGISTRY[algo].supports


@pytest.mark.parametrize("algo", ALGOS)
def test_early_stopping_keep_best_eval_every_and_tensorboard(tmp_path, monkeypatch, algo):
    # evals every 4 steps: best 0.7 at step 8, then 0.65 and 0.6: patience 2 ends the run at 16
    cfg = _cfg(tmp_path, algo, eval_every=4, early_stop_patience=2, keep_best=True,
               tensorboard=True)
    if not _capable(algo, "in_loop_eval"):
        with pytest.raises(ValueError, match=f"runs with --algo .*; --algo {algo} "):
            algorithms.run(cfg)
        return
    _scripted(monkeypatch, [0.6, 0.7, 0.65, 0.6] + [0.9] * 4)
    summary = algorithms.run(cfg)
    assert (summary["steps"], summary["early_stopped"]) == (16, True)
    assert (summary["best_step"], summary["best_metric"]) == (8, 0.7)
    assert Checkpointer(os.path.join(cfg.train.out, "best")).all_steps() == [8]
    with open(os.path.join(cfg.train.out, "metrics.jsonl")) as f:
        evals = [r["step"] for r in map(json.loads, f) if r["kind"] == "eval"]
    assert evals == [4, 8, 12, 16]
    assert _tfrecord_steps(os.path.join(cfg.train.out, "tb"), "eval/auc") == evals


@pytest.mark.parametrize("algo", ALGOS)
def test_a_dense_lr_schedule_is_honoured(tmp_path, algo):
    lr, warmup = 1e-3, 10_000
    dense = DenseOptimConfig(name="adam", lr=lr, lr_schedule="constant", warmup_steps=warmup)
    cfg = _cfg(tmp_path, algo, steps=16)
    cfg = dataclasses.replace(cfg, dense=dense)
    algorithms.run(cfg)
    _, _, _, init = build(cfg, SyntheticSource(cfg.synthetic).spec)
    init = jax.tree.map(np.asarray, init)
    ckpt = Checkpointer(os.path.join(cfg.train.out, "checkpoints"))  # the single-device layout
    final, _ = ckpt.restore(init)
    ckpt.close()
    assert int(final.step) == 16
    moved = max(float(np.max(np.abs(a - b)))
                for a, b in zip(jax.tree.leaves(final.params), jax.tree.leaves(init.params)))
    # lr_t = lr * t / warmup: every update of the run together moves a parameter by at most
    # ~sum over 16 steps (async: 16 pushes) of lr_t = lr * 136 / warmup = 1.4e-5
    bound = 2 * lr * 136 / warmup
    assert 0 < moved <= bound, (moved, bound)


@pytest.mark.parametrize("algo", ALGOS)
def test_periodic_checkpoints_and_resume_end_where_the_uninterrupted_run_ends(tmp_path, algo):
    whole = algorithms.run(_cfg(tmp_path, algo, "whole", steps=16, ckpt_every=8))
    algorithms.run(_cfg(tmp_path, algo, "parts", steps=16, ckpt_every=8, stop_after=8))
    assert Checkpointer(str(tmp_path / "parts" / "checkpoints")).all_steps() == [8]
    resumed = algorithms.run(_cfg(tmp_path, algo, "parts", steps=16, ckpt_every=8, resume=True))
    assert resumed["steps"] == whole["steps"] == 16
    assert_trees(resumed["final_state"], whole["final_state"])
    assert resumed["eval_auc"] == whole["eval_auc"]
