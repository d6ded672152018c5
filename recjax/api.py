"""recjax as a library: train any `--algo` on one's own arrays or files from Python.

    import recjax
    src = recjax.ArraySource(label=y, dense=x, ids=c)
    result = recjax.fit("default", train=src, overrides={"model.name": "deepfm"})
    result["eval_auc"], result["eval_ne"]

`fit` is what ``scripts/train.py`` does after parsing its flags: the same `Config`, the same
strict override validation, the same run contract (summary, metrics.jsonl, checkpoints when
``train.out`` is set), and it returns the summary dict instead of printing it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from recjax import configs
from recjax.config import Config, ConfigError, apply_overrides
from recjax.config_files import override_text
from recjax.data import arrays
from recjax.data.arrays import ArraySource
from recjax.data.synthetic import preset, synthetic_name


def make_config(cfg: Config | str | None = None, overrides: Mapping[str, Any] | None = None
                ) -> Config:
    """A `Config` from a named config (or a `Config`, or None = ``default``) plus overrides.

    Args:
      cfg: a `Config`, a name of `recjax.configs.CONFIGS`, or None for ``default``.
      overrides: ``{"section.field": value}``; values are checked as ``--section.field=value``
        is (unknown keys are refused with the closest valid names).

    Raises:
      ConfigError: unknown key or badly typed value.
    """
    if cfg is None or isinstance(cfg, str):
        cfg = configs.get(cfg or "default")
    if not isinstance(cfg, Config):
        raise ConfigError(f"cfg must be a recjax.Config or a config name "
                          f"({', '.join(configs.CONFIGS)}), got {type(cfg).__name__}")
    pairs = [(k, override_text(v)) for k, v in (overrides or {}).items()]
    name = dict(pairs).get("data.train")
    if name is not None and synthetic_name(name) is not None:  # as --data synthetic:NAME does
        cfg = dataclasses.replace(cfg, synthetic=preset(synthetic_name(name)))
    return apply_overrides(cfg, pairs)


def fit(cfg: Config | str | None = None, *, train: ArraySource | str | None = None,
        eval: ArraySource | str | None = None, overrides: Mapping[str, Any] | None = None
        ) -> dict:
    """Train and evaluate as `cfg` says, on `train` (and `eval`), with any algorithm.

    Args:
      cfg: a `Config`, a named config (``"default"``, ``"smoke"``, ``"criteo"``, ...) or None.
      train: training data: an `ArraySource` (one's own numpy arrays) or a data spec
        (``criteo:PATH``, ``synthetic:smoke``); None = the config's ``data.train``.
      eval: eval data, likewise; None = the config's ``data.eval`` (empty: a seeded hold-out
        split of ``train``, ``data.holdout`` of its rows).
      overrides: ``{"section.field": value}`` applied last, e.g. ``{"model.name": "fm",
        "train.epochs": 3, "train.algo": "shadow"}`` (see ``scripts/train.py --help-config``).

    Returns:
      The run's summary (the keys of summary.json: ``eval_auc``, ``eval_ne``, ``train_ne``,
      ``examples_per_sec``, the algorithm's counters, ``config``, ...); the single-device and
      SPMD trainers add ``final_state`` (the trained `TrainState`).

    Raises:
      ConfigError: a bad override. DataError: bad input data (row and field named).
    """
    cfg = make_config(cfg, overrides)
    registered = []
    data = {}
    for key, source in (("train", train), ("eval", eval)):
        if isinstance(source, ArraySource):
            spec = arrays.register(source)
            registered.append(spec)
            data[key] = spec
        elif isinstance(source, str):
            data[key] = source
        elif source is not None:
            raise TypeError(f"{key}= takes an ArraySource or a data spec string, got "
                            f"{type(source).__name__}")
    if data:
        cfg = make_config(cfg, {f"data.{k}": v for k, v in data.items()})
    try:
        # The one place recjax reaches up to algorithms/ (DESIGN.md section 2 keeps recjax free of
        # it at import time): the dispatch by train.algo lives there, and importing it here,
        # only when called, keeps `import recjax` light and the layers acyclic.
        import algorithms
        from recjax import compile_cache

        compile_cache.enable(cfg.train.compile_cache)
        return algorithms.run(cfg)
    finally:
        for spec in registered:
            arrays.unregister(spec)
