"""The models studies now run on (DCN-v2, DIN, BST; issue 39) under every algorithm: each trains
them or refuses them with the registry's reason (DES has no substitution for any of them);
sync with table sharding reaches single's numbers; Persia carries a sequence's position fields
through its compressed activation path. The models' own numbers against their references are
in tests/test_models_{dcn_v2,din,bst}.py."""

import dataclasses

import numpy as np
import pytest

import algorithms
from recjax import registry
from recjax.models import ModelConfig
from tests.runtime_util import small_cfg

SEQUENCE = ("din", "bst")  # on the synthetic teacher with a behaviour sequence
MODELS = ("dcn_v2", *SEQUENCE)
MIN_AUC = {"dcn_v2": 0.5, "din": 0.0, "bst": 0.0}  # 16 smoke steps: DCN-v2 is above chance
# sync's table shardings per model (DIN: all four, the sequence's rows split every way)
SHARDINGS = {"din": ("data_parallel", "table_wise", "row_wise", "column_wise"),
             "bst": ("data_parallel", "row_wise")}


def _cfg(model: str, algo: str):
    """`model` (smoke size; DCN-v2 low-rank with 2 experts) under `algo`, 16 steps of 64 rows;
    the sequence models on 8K rows of the synthetic teacher with a sequence (L = 8)."""
    cfg = small_cfg(algo, steps=16, dense=("adam", 3e-3), sparse=("adagrad", 0.05))
    if model == "dcn_v2":
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            ModelConfig.smoke("dcn_v2"), cross_rank=4, cross_experts=2))
    else:
        data = dataclasses.replace(cfg.data, train="synthetic-seq:n=8192,max_len=8",
                                   eval="synthetic-seq:n=1024,max_len=8,split=eval")
        cfg = dataclasses.replace(cfg, model=ModelConfig.smoke(model), data=data)
    if registry.REGISTRY[algo].kind == registry.SPMD:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, devices=2))
    return cfg


@pytest.mark.parametrize("model", MODELS)
def test_des_refuses_them_with_the_reason(model):
    """DES substitutes the models of sharding/des.py SUBSTITUTIONS; none of these is one
    (docs/models.md says what DIN's substitution would be)."""
    with pytest.raises(ValueError, match=f"no equivalent substitution for model '{model}'"):
        algorithms.run(_cfg(model, "des"))


@pytest.mark.slow
@pytest.mark.parametrize("algo", [a for a in registry.NAMES if a != "des"])
@pytest.mark.parametrize("model", MODELS)
def test_every_algorithm_trains_them(model, algo):
    """single, sync, the host-async algorithms (Persia's activation path included) and DiLoCo
    train them through the same [B, F, D] boundary as every model (sequences padded)."""
    summary = algorithms.run(_cfg(model, algo))
    assert summary["steps"] == 16 and np.isfinite(summary["train_ne"])
    assert np.isfinite(summary["eval_ne"]) and MIN_AUC[model] < summary["eval_auc"] < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("model,sharding", [(m, s) for m in SEQUENCE for s in SHARDINGS[m]])
def test_sync_with_table_sharding_equals_single(model, sharding):
    """sync on 2 devices (the sequence's rows sharded as told, sync's routed lookups on the row-
    wise ones) reaches single's train and eval numbers on the same batches."""
    cfg = _cfg(model, "sync")
    spmd = dataclasses.replace(cfg.spmd, table_rules=f".*:{sharding}")
    sync = algorithms.run(dataclasses.replace(cfg, spmd=spmd))
    single = algorithms.run(_cfg(model, "single"))
    for key in ("train_ne", "eval_ne"):
        assert sync[key] == pytest.approx(single[key], rel=1e-5, abs=1e-6), key
    # AUC ranks the eval rows: float32 logits that differ in summation order (the row-wise
    # tables' routed lookups) swap a few near-ties, a step of 1 / (positives x negatives)
    # each: bst row_wise 6.2e-6 apart on an AMD EPYC VM (2026-11-28), within 1e-5 elsewhere
    assert sync["eval_auc"] == pytest.approx(single["eval_auc"], abs=3e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", SEQUENCE)
def test_persia_compresses_the_sequence_activations(model):
    """Persia with fp16 activations (--persia.compress both) carries the position fields'
    activations like any field's, in fewer bytes; the padded positions' zeros stay exact zeros
    in fp16, so they stay padding."""
    cfg = _cfg(model, "persia")
    cfg = dataclasses.replace(cfg, persia=dataclasses.replace(cfg.persia, compress="both"))
    s = algorithms.run(cfg)
    assert s["steps"] == 16 and np.isfinite(s["eval_ne"]) and 0.0 < s["eval_auc"] < 1.0
    assert s["bytes"]["embedding->nn"]["sent"] < s["bytes"]["embedding->nn"]["raw"]
