"""Which run the training features (issue 15) fit, checked before anything is built.

The features and where they live:

* lr schedule, warm-up: ``dense.lr_schedule``, ``dense.warmup_steps``, ...
  (recjax/train/schedules.py; FuxiCTR ``lr_scheduler``);
* dropout, batch norm: ``model.dropout``, ``model.batch_norm`` (recjax/models/ops.py `MLP`;
  FuxiCTR ``net_dropout``, ``batch_norm``);
* embedding L2: ``sparse.embedding_l2`` (recjax/embeddings/sparse_optim.py `with_l2`; FuxiCTR
  ``embedding_regularizer``);
* per-table dims: ``embed.dims`` (recjax/embeddings/tables.py `make_layout`; FuxiCTR's
  per-feature ``embedding_dim``);
* early stopping, best checkpoint: ``train.early_stop_patience``, ``train.monitor``,
  ``train.keep_best`` (recjax/train/early_stop.py; FuxiCTR ``early_stop_patience``,
  ``monitor``).

Algorithms (DESIGN.md section 4). Dropout and batch norm change the training forward pass, which
only the single trainer and sync (`loss_and_grads_train`) run; every other algorithm refuses
them here instead of training in eval mode. The schedule and the L2 term live in the
optimizers every algorithm builds from the config (`setup.make_dense_tx`,
`make_sparse_optimizer`), so all of them honour those. Early stopping needs the shared trainer's
in-loop evals (single, sync, des); per-table dims the single-device lookup. Which algorithm
honours which setting is a capability of its row in recjax/registry.py, and the refusals are
that module's `RULES`.

This module imports nothing heavy: recjax/config.py calls its checks from ``__post_init__``.
"""

from __future__ import annotations

import re

from recjax import registry

SCHEDULES = ("constant", "cosine", "linear", "step", "exponential")  # dense.lr_schedule

# monitor -> (key of `contract.evaluate`'s result, +1 if higher is better else -1)
MONITORS = {"eval_auc": ("auc", 1), "eval_ne": ("ne", -1), "eval_logloss": ("logloss", -1)}
MONITOR_NAMES = tuple(MONITORS)  # train.monitor

DIMS_MODELS = ("wide_deep", "dcn", "dcn_v2")  # zero padding is a narrower field to them


def check_schedule(dense) -> None:
    """``DenseOptimConfig.__post_init__``: the schedule fields (``lr_schedule``'s choices are
    its annotation, checked with the section's other choices)."""
    if dense.warmup_steps < 0:
        raise ValueError(f"dense.warmup_steps must be >= 0 (0 = no warm-up), got "
                         f"{dense.warmup_steps}")
    if dense.decay_steps < 0:
        raise ValueError(f"dense.decay_steps must be >= 0, got {dense.decay_steps}")
    if not 0.0 <= dense.end_lr_ratio <= 1.0:
        raise ValueError(f"dense.end_lr_ratio must be in [0, 1], got {dense.end_lr_ratio}")
    if not 0.0 < dense.decay_rate <= 1.0:
        raise ValueError(f"dense.decay_rate must be in (0, 1], got {dense.decay_rate}")


def check_early_stop(train) -> None:
    """``TrainConfig.__post_init__``: patience (``monitor``'s choices are its annotation,
    checked with the section's other choices)."""
    if train.early_stop_patience < 0:
        raise ValueError(f"train.early_stop_patience must be >= 0 (0 = off), got "
                         f"{train.early_stop_patience}")


def parse_dims(text: str) -> tuple[tuple[str, int], ...]:
    """``embed.dims`` -> ``((regex, dim), ...)`` in order; the first match wins.

    Raises:
      ValueError: a rule without ``:``, a bad regex, or a dim that is not a positive integer.
    """
    rules = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        pattern, sep, dim = part.rpartition(":")
        if not sep or not pattern:
            raise ValueError(f"embed.dims: rule {part!r} must look like regex:dim (e.g. C1:32)")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"embed.dims: bad regex {pattern!r} ({e})") from None
        if not dim.strip().isdigit() or int(dim) < 1:
            raise ValueError(f"embed.dims: dim of rule {part!r} must be an integer >= 1")
        rules.append((pattern, int(dim)))
    return tuple(rules)


def table_dims(text: str, tables, default: int) -> dict[str, int]:
    """``table name -> dim`` for the tables of a spec (regexes ``fullmatch`` the name).

    Raises:
      ValueError: a dim above ``default`` (model.embed_dim, the activation width).
    """
    rules = parse_dims(text)
    out = {}
    for t in tables:
        dim = next((d for p, d in rules if re.fullmatch(p, t)), default)
        if dim > default:
            raise ValueError(f"embed.dims gives table {t!r} dim {dim} > model.embed_dim={default}; "
                             "model.embed_dim is the widest table (narrower ones are zero-padded "
                             "to it): raise it or lower the rule")
        out[t] = dim
    return out


def check_features(cfg) -> None:
    """Refuse a feature the run's algorithm or model cannot honour (called by
    `setup.make_model`, which every algorithm goes through), and the checks across fields
    (here rather than in ``__post_init__``, where ``--a=x --b=y`` would be judged after ``a``
    alone)."""
    m, d = cfg.model, cfg.dense
    if d.lr_schedule != "constant" and d.decay_steps == 0:
        raise ValueError(f"dense.lr_schedule={d.lr_schedule} needs dense.decay_steps > 0 "
                         "(cosine/linear: length of the decay after the warm-up, e.g. the run's "
                         "steps; step/exponential: steps per factor dense.decay_rate)")
    registry.check(cfg)  # the settings the algorithm cannot honour (dropout, early stop, ...)
    if (m.dropout or m.batch_norm) and m.name in ("lr", "fm"):
        raise ValueError(f"model.dropout / model.batch_norm act on MLP layers and model "
                         f"{m.name!r} has none; use wide_deep, deepfm, dlrm, dcn or dcn_v2, or drop "
                         "those flags")
    tc = cfg.train
    if (tc.early_stop_patience or tc.keep_best) and not tc.eval_every:
        raise ValueError("train.early_stop_patience / train.keep_best compare the evals made every "
                         "train.eval_every steps; set train.eval_every > 0")
    if cfg.embed.dims and m.name not in DIMS_MODELS:
        raise ValueError(f"embed.dims (per-table embedding dims) is for "
                         f"{' and '.join(DIMS_MODELS)}: model {m.name!r} "
                         + ("has no embeddings but the dim-1 wide weights" if m.name == "lr"
                            else "compares behaviours with the target's embedding (e - v_A, "
                            "e * v_A), which needs one width (model.embed_dim)" if m.name == "din"
                            else "takes dot products between fields' embeddings, which "
                            "need one width (model.embed_dim)")
                         + "; drop embed.dims")
