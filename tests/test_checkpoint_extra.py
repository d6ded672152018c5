"""An algorithm's own state in a checkpoint (`Checkpointer.save(..., extra=)`): committed with
the train state, checksummed like it, read back only by `restore_extra`, and invisible to every
reader of the train state (so any algorithm still resumes from any checkpoint)."""

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from recjax.checkpoint import CheckpointCorruptError, Checkpointer
from tests.test_checkpoint_integrity import _assert_same, _flip, _state


def _extra(seed: int) -> dict:
    rng = np.random.default_rng(100 + seed)
    return {"replicas": [jnp.asarray(rng.normal(size=(64, 32)), jnp.float32) for _ in range(3)],
            "ids": np.arange(seed, seed + 50, dtype=np.int64)}


def test_extra_round_trips_and_the_train_state_reads_as_without_it(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "c"))
    ckpt.save(5, _state(5), {"k": 1}, extra=_extra(5))
    ckpt.save(6, _state(6), {"k": 2})  # a step without extra (another algorithm wrote it)
    ckpt.close()
    ckpt = Checkpointer(str(tmp_path / "c"))
    state, meta = ckpt.restore(_state(0), step=5)
    _assert_same(state, _state(5))
    assert meta["k"] == 1
    extra = ckpt.restore_extra(5, _extra(0))
    _assert_same(extra, _extra(5))
    assert extra["ids"].dtype == np.int64
    assert ckpt.restore_extra(6, _extra(0)) is None


def test_extra_of_another_shape_is_a_mismatch_not_damage(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "c"))
    ckpt.save(5, _state(5), {}, extra=_extra(5))
    two = {"replicas": _extra(0)["replicas"][:2], "ids": _extra(0)["ids"]}
    with pytest.raises(ValueError, match="algorithm's own state does not fit"):
        ckpt.restore_extra(5, two)


def test_flipped_bytes_of_the_extra_are_found(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "c"))
    ckpt.save(5, _state(5), {}, extra=_extra(5))
    ckpt.close()
    files = [p for p in (pathlib.Path(tmp_path) / "c" / "5" / "extra").rglob("*") if p.is_file()]
    _flip(max(files, key=lambda p: p.stat().st_size))
    ckpt = Checkpointer(str(tmp_path / "c"))
    with pytest.raises(CheckpointCorruptError, match="algorithm state"):
        ckpt.restore_extra(5, _extra(0))
