"""Named configs (`--config NAME`), each a function returning a `Config`.

Each docstring holds the command that runs it. Flags and `--section.field=value` overrides are
applied on top, so a named config is a starting point, not a cage.
"""

from __future__ import annotations

import dataclasses

from recjax.config import Config, DataConfig, DenseOptimConfig, TrainConfig
from recjax.data.synthetic import PRESETS
from recjax.embeddings import SparseOptimConfig
from recjax.models.config import ModelConfig


def default() -> Config:
    """DLRM on the built-in synthetic data; under a minute on a 2-core laptop.

        python scripts/train.py
    """
    return Config(
        data=DataConfig(train="synthetic:default"),
        synthetic=PRESETS["default"],
        model=ModelConfig(name="dlrm", embed_dim=16, bottom_mlp=(64, 32), top_mlp=(128, 64)),
        dense=DenseOptimConfig(name="adam", lr=2e-3),
        sparse=SparseOptimConfig(name="adagrad", lr=0.05),
        train=TrainConfig(batch_size=1024, epochs=2, log_every=50),
    )


def smoke() -> Config:
    """Seconds-long run of every piece (tests, CI):

        python scripts/train.py --config smoke
    """
    c = default()
    return dataclasses.replace(
        c, data=dataclasses.replace(c.data, train="synthetic:smoke"),
        synthetic=PRESETS["smoke"], model=ModelConfig.smoke("dlrm"),
        train=dataclasses.replace(c.train, batch_size=256, log_every=20))


def dlrm_kaggle() -> Config:
    """DLRM at the Criteo-Kaggle shape of PERF_NOTES (26 tables x0.5, D=16, B=4096, SGD):

        python scripts/train.py --config dlrm_kaggle --steps 200
    """
    return Config(
        data=DataConfig(train="synthetic:criteo", prefetch=4),
        synthetic=PRESETS["criteo"],
        model=ModelConfig(name="dlrm", embed_dim=16),
        dense=DenseOptimConfig(name="sgd", lr=0.1),
        sparse=SparseOptimConfig(name="sgd", lr=0.1),
        train=TrainConfig(batch_size=4096, log_every=20),
    )


def criteo() -> Config:
    """Logistic regression on the Criteo Kaggle 8k sample (valid AUC >= 0.70).

    Paths are relative to $RECJAX_DATA (default: ../shared/data next to the checkout):

    The sample is 7,200 lines, so deep models overfit it within an epoch unless tuned (the
    README Quickstart's DeepFM command, with its own settings, reaches valid AUC 0.706); LR with
    Adagrad is the strong baseline here.

        python scripts/train.py --config criteo --out runs/criteo
    """
    return Config(
        data=DataConfig(train="criteo:criteo_kaggle_8k/train.tsv",
                        eval="criteo:criteo_kaggle_8k/valid.tsv", hash_buckets=1 << 15),
        model=ModelConfig(name="lr", embed_dim=8, deep_mlp=(64, 32)),
        dense=DenseOptimConfig(name="adam", lr=1e-3),
        sparse=SparseOptimConfig(name="adagrad", lr=0.01),
        train=TrainConfig(batch_size=256, epochs=3, log_every=10),
    )


def frappe() -> Config:
    """FM on Frappe with a seeded 90/10 hold-out split (AUC >= 0.93):

        python scripts/train.py --config frappe --out runs/frappe
    """
    return Config(
        data=DataConfig(train="frappe:frappe/frappe.train.libfm"),
        model=ModelConfig(name="fm", embed_dim=16),
        dense=DenseOptimConfig(name="adam", lr=1e-3),
        sparse=SparseOptimConfig(name="adagrad", lr=0.1),
        train=TrainConfig(batch_size=512, epochs=10, log_every=50),
    )


CONFIGS = {"default": default, "smoke": smoke, "dlrm_kaggle": dlrm_kaggle, "criteo": criteo,
           "frappe": frappe}


def get(name: str) -> Config:
    if name not in CONFIGS:
        raise ValueError(f"unknown --config {name!r}; named configs: {', '.join(CONFIGS)}")
    return CONFIGS[name]()
