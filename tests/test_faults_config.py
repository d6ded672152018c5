"""Issue 16, items 6 and 13: config values that make no sense are refused, naming the key, the
value and what is allowed; summary.json is written with the usual (umask) file mode."""

import os
import stat

import pytest

from recjax.config import DataConfig, TrainConfig
from recjax.runlog import write_json_atomic


@pytest.mark.parametrize("key,value,allowed", [
    ("keep_ckpts", 0, ">= 1"),  # item 6: keeps nothing
    ("keep_ckpts", -3, ">= 1"),
    ("ckpt_every", -1, ">= 0"),  # item 6: saved every step
    ("seed", -1, ">= 0"),
    ("eval_every", -5, ">= 0"),
    ("stop_after", -1, ">= 0"),
    ("devices", -2, ">= 0"),
])
def test_train_config_refuses_nonsense(key, value, allowed):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{key: value})
    msg = str(e.value)
    assert f"train.{key}" in msg and str(value) in msg and allowed in msg, msg


def test_ckpt_every_zero_is_explained():
    with pytest.raises(ValueError, match=r"0 = at the end \(and each epoch's end in long runs\)"):
        TrainConfig(ckpt_every=-1)


@pytest.mark.parametrize("key,value,allowed", [
    ("split_seed", -1, ">= 0"),
    ("prefetch", -1, ">= 0"),
    ("shuffle_buffer", -1, ">= 0"),
    ("cache_rows", -1, ">= 0"),
    ("multi_hot_len", 0, ">= 1"),
])
def test_data_config_refuses_nonsense(key, value, allowed):
    with pytest.raises(ValueError) as e:
        DataConfig(**{key: value})
    msg = str(e.value)
    assert f"data.{key}" in msg and str(value) in msg and allowed in msg, msg


def test_sensible_values_still_accepted():
    TrainConfig(keep_ckpts=1, ckpt_every=0, seed=0, eval_every=0, stop_after=0, devices=0)
    DataConfig(split_seed=0, prefetch=0, shuffle_buffer=0, cache_rows=0, multi_hot_len=1)


def test_summary_json_mode_follows_umask(tmp_path):
    """Item 13: mkstemp made summary.json 0600; it must be what `open()` makes (0644 at 022)."""
    old = os.umask(0o022)
    try:
        write_json_atomic(str(tmp_path / "summary.json"), {"a": 1})
        write_json_atomic(str(tmp_path / "summary.json"), {"a": 2})  # replace keeps it atomic
    finally:
        os.umask(old)
    p = tmp_path / "summary.json"
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    assert p.read_text() == '{\n  "a": 2\n}\n'
    assert [f.name for f in tmp_path.iterdir()] == ["summary.json"]  # no temp file left
