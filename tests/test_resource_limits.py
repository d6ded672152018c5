"""Issue 40 item 13: sizes beyond the machine are refused before allocating, with the number
and what to lower; seeds beyond 64 bits are a config error, not an OverflowError traceback."""

import collections
import dataclasses

import pytest

from recjax import configs
from recjax.config import ConfigError, SparseOptimConfig, apply_overrides
from recjax.embeddings import make_sparse_optimizer
from recjax.train import setup

Mem = collections.namedtuple("Mem", "available")
CRITEO = configs.criteo()  # LR on Criteo: 26 `wide` tables of dim 1 (+ 13 dense)


def _layout(cfg):
    from tests.test_features_defaults import SPEC

    return setup.make_model(cfg, SPEC).layout


@pytest.mark.parametrize("name,floats_per_row", [("sgd", 1), ("adagrad", 2),
                                                 ("rowwise_adagrad", None)])
def test_table_bytes_by_hand(name, floats_per_row):
    cfg = dataclasses.replace(configs.smoke(), sparse=SparseOptimConfig(name=name))
    layout = _layout(cfg)
    got = setup.table_bytes(layout, make_sparse_optimizer(cfg.sparse))
    for t in layout.tables:
        rows, dim = t.num_embeddings, t.embedding_dim
        want = (rows * dim * 4 * floats_per_row if floats_per_row
                else rows * dim * 4 + rows * 4)  # one accumulator per row
        assert got[t.name] == want, (t.name, got[t.name], want)
    lru = setup.table_bytes(layout, make_sparse_optimizer(cfg.sparse), lru=True)
    assert all(lru[t.name] == got[t.name] + 116 * t.num_embeddings for t in layout.tables)


def test_tables_beyond_the_available_memory_are_refused_before_allocating(monkeypatch):
    import psutil

    cfg = configs.smoke()
    layout = _layout(cfg)
    opt = make_sparse_optimizer(cfg.sparse)
    need = sum(setup.table_bytes(layout, opt).values())
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem(need - 1))
    with pytest.raises(ValueError, match=r"need .* GiB .* more than the .* GiB this machine has "
                                         r"available: lower --data.hash_buckets"):
        setup.check_memory(cfg, layout, opt)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem(need))
    setup.check_memory(cfg, layout, opt)
    off = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, memory_check=False))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem(0))
    setup.check_memory(off, layout, opt)


@pytest.mark.parametrize("key", ["train.seed", "data.split_seed"])
def test_a_seed_beyond_64_bits_is_a_config_error(key):
    with pytest.raises(ConfigError, match=r"must be <= 2\*\*63 - 1"):
        apply_overrides(CRITEO, [(key, str(10**20))])
    apply_overrides(CRITEO, [(key, str(2**63 - 1))])


def test_an_lru_capacity_beyond_the_machine_is_refused_from_the_cli():
    """``--embed.capacity 2**40`` was a MemoryError traceback."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    r = subprocess.run([sys.executable, "scripts/train.py", "--config", "smoke", "--algo", "async",
                        "--embed.store", "lru", "--embed.capacity", str(2**40), "--steps", "2",
                        "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "lower --embed.capacity (now 1099511627776)" in r.stderr
