"""Behaviour sequences as data: a synthetic teacher whose label depends on which behaviours are
relevant to the target (``synthetic-seq``), and any multi-hot field read as position fields
(``seq:KIND:PATH``, e.g. ``seq:taobao:taobao_ad_tiny/train_sample.csv``). Both give the layout of
recjax/models/sequence.py, which the DIN model reads.

The teacher (``--data synthetic-seq[:key=value,...]``). Items ``i < n_items`` each belong to a
category ``c(i) < n_categories`` (a fixed random assignment). An example has

* a context id ``x < n_context`` (uniform), with first-order weight ``w_x``;
* a behaviour sequence ``b_1 .. b_len`` of items, ``len`` uniform in ``[1, max_len]`` (the rest
  of the L positions are padding), each item uniform, and the sequence of their categories
  ``c(b_1) .. c(b_len)`` (the paper's behaviours carry goods and category ids, Sec. 4.1);
* a target item ``t``: with probability ``p_related`` an item of the category of a random one of
  the behaviours, else uniform; first-order weight ``w_t``; and its category ``c(t)``;

and the label is Bernoulli(sigmoid(z)) with

    z = bias + w_t + w_x + alpha * m,   m = #{j <= len : c(b_j) = c(t)},

the number of behaviours *relevant to the target*. The Bayes-optimal predictor is sigmoid(z)
(no hidden noise), so its NE on the eval rows is the floor (`bayes_optimal`). Sum pooling sees
only ``sum_j e_{b_j}``: with embeddings narrower than the number of categories that sum cannot
give back the count of one category for every target, while DIN's activation unit can weigh each
behaviour by its match with the target (docs/models.md measures the gap).

Options (``synthetic-seq:n=200000,seed=3,split=eval``): ``n`` rows, ``seed`` of the example stream
(the teacher's parameters come from ``teacher_seed``, so train and eval streams share them),
``split`` train | eval (the eval stream draws other examples of the same teacher), and every
field of `SeqTeacherConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk
from recjax.data.base import DataSource, ReadStats
from recjax.features import FeatureSpec, FieldSpec
from recjax.models.sequence import unroll_chunk, unroll_spec

CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class SeqTeacherConfig:
    """The teacher and its streams (module docstring).

    Attributes:
      n: rows of the stream.
      split: train | eval: which stream of examples (the teacher is the same).
      seed: seed of the example stream.
      teacher_seed: seed of the teacher's parameters (categories, weights).
      n_items: items (the target's and the behaviours' vocabulary).
      n_categories: item categories.
      n_context: context ids.
      max_len: L, the padded sequence length.
      p_related: probability that the target shares a category with a behaviour.
      alpha: logit per relevant behaviour.
      item_std: std of the items' first-order weights w_t.
      context_std: std of the context weights w_x.
      bias: teacher bias (sets the click rate).
    """

    n: int = 200_000
    split: str = "train"
    seed: int = 0
    teacher_seed: int = 1234
    n_items: int = 1000
    n_categories: int = 40
    n_context: int = 50
    max_len: int = 20
    p_related: float = 0.5
    alpha: float = 0.6
    item_std: float = 0.5
    context_std: float = 0.3
    bias: float = -1.8

    def __post_init__(self):
        if self.split not in ("train", "eval"):
            raise ValueError(f"synthetic-seq: split must be train or eval, got {self.split!r}")
        for name in ("n", "n_items", "n_categories", "n_context"):
            if getattr(self, name) < 1:
                raise ValueError(f"synthetic-seq: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_len < 2:
            raise ValueError(f"synthetic-seq: max_len must be >= 2, got {self.max_len}")
        if not 0.0 <= self.p_related <= 1.0:
            raise ValueError(f"synthetic-seq: p_related must be in [0, 1], got {self.p_related}")

    @classmethod
    def parse(cls, arg: str) -> SeqTeacherConfig:
        """``key=value,...`` (the text after ``synthetic-seq:``); values take the field's type."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        kw = {}
        for part in filter(None, (p.strip() for p in arg.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in types:
                raise ValueError(f"synthetic-seq: bad option {part!r}; write key=value with key one "
                                 f"of {', '.join(types)}")
            conv = {"int": int, "float": float, "str": str}[types[key]]
            try:
                kw[key] = conv(value)
            except ValueError:
                raise ValueError(f"synthetic-seq: option {key}={value!r} is not a {types[key]}"
                                 ) from None
        return cls(**kw)


def multi_hot_spec(cfg: SeqTeacherConfig) -> FeatureSpec:
    """The teacher's fields before unrolling: context, item and cate (the targets), hist and
    hist_cate (the behaviours, sharing the targets' tables)."""
    return FeatureSpec((), (
        FieldSpec("context", cfg.n_context), FieldSpec("item", cfg.n_items),
        FieldSpec("cate", cfg.n_categories),
        FieldSpec("hist", cfg.n_items, max_len=cfg.max_len, table="item"),
        FieldSpec("hist_cate", cfg.n_categories, max_len=cfg.max_len, table="cate")))


class SeqTeacherSource:
    """`DataSource` of the teacher's stream, in the position layout; see the module docstring."""

    def __init__(self, cfg: SeqTeacherConfig, name: str = "synthetic-seq"):
        self.cfg, self.name = cfg, name
        self.multi_spec = multi_hot_spec(cfg)
        self.spec = unroll_spec(self.multi_spec)
        self.stats = ReadStats()
        self.num_rows = cfg.n
        rng = np.random.default_rng([cfg.teacher_seed, 17])
        self.category = rng.integers(0, cfg.n_categories, cfg.n_items)
        self.w_item = rng.normal(0, cfg.item_std, cfg.n_items)
        self.w_context = rng.normal(0, cfg.context_std, cfg.n_context)
        order = np.argsort(self.category, kind="stable")
        self._by_cat = np.split(order, np.cumsum(np.bincount(self.category,
                                                             minlength=cfg.n_categories))[:-1])

    def _generate(self, index: int, n: int) -> tuple[Chunk, np.ndarray]:
        c = self.cfg
        rng = np.random.default_rng([c.seed, 0 if c.split == "train" else 1, index])
        context = rng.integers(0, c.n_context, n)
        length = rng.integers(1, c.max_len + 1, n)
        hist = rng.integers(0, c.n_items, (n, c.max_len))
        real = np.arange(c.max_len)[None, :] < length[:, None]
        target = rng.integers(0, c.n_items, n)
        related = rng.random(n) < c.p_related
        pick = hist[np.arange(n), (rng.random(n) * length).astype(np.int64)]
        u = rng.random(n)
        for i in np.flatnonzero(related):  # an item of the category of a random behaviour
            members = self._by_cat[self.category[pick[i]]]
            target[i] = members[int(u[i] * len(members))]
        m = ((self.category[hist] == self.category[target][:, None]) & real).sum(1)
        z = c.bias + self.w_item[target] + self.w_context[context] + c.alpha * m
        p = 1.0 / (1.0 + np.exp(-z))
        label = (rng.random(n) < p).astype(np.float32)
        ids = np.zeros((n, 5, c.max_len), np.int32)
        mask = np.zeros((n, 5, c.max_len), np.float32)
        ids[:, 0, 0], ids[:, 1, 0], ids[:, 2, 0] = context, target, self.category[target]
        mask[:, :3, 0] = 1.0
        ids[:, 3, :] = np.where(real, hist, 0)
        ids[:, 4, :] = np.where(real, self.category[hist], 0)
        mask[:, 3, :] = mask[:, 4, :] = real
        row = np.arange(index * CHUNK, index * CHUNK + n, dtype=np.int64)
        chunk = Chunk(np.zeros((n, 0), np.float32), ids, mask, label, row)
        return unroll_chunk(chunk, self.multi_spec), p

    def _stream(self) -> Iterator[tuple[Chunk, np.ndarray]]:
        for i, start in enumerate(range(0, self.cfg.n, CHUNK)):
            yield self._generate(i, min(CHUNK, self.cfg.n - start))

    def chunks(self) -> Iterator[Chunk]:
        self.stats = ReadStats()
        for chunk, _ in self._stream():
            self.stats.rows += chunk.size
            yield chunk

    def bayes_optimal(self) -> dict:
        """Metrics of the Bayes-optimal p* = sigmoid(z) on this stream's examples."""
        from recjax.metrics import auc, logloss, normalized_entropy

        pairs = list(self._stream())
        y = np.concatenate([c.label for c, _ in pairs])
        p = np.concatenate([q for _, q in pairs])
        return {"ne": float(normalized_entropy(y, p)), "logloss": float(logloss(y, p)),
                "auc": float(auc(y, p))}


def describe(cfg) -> dict:
    """Facts of a run's ``synthetic-seq`` eval data (a study's ``describe``): the Bayes-optimal
    NE and AUC on its rows; {} for other data."""
    kind, _, arg = cfg.data.eval.partition(":")
    if kind != "synthetic-seq":
        return {}
    bayes = SeqTeacherSource(SeqTeacherConfig.parse(arg)).bayes_optimal()
    return {"bayes_eval_ne": round(bayes["ne"], 5), "bayes_eval_auc": round(bayes["auc"], 5)}


class PositionsSource:
    """Another source with its multi-hot fields read as position fields (``seq:KIND:PATH``)."""

    def __init__(self, inner: DataSource, name: str):
        self.inner, self.name = inner, name
        self.spec = unroll_spec(inner.spec)

    @property
    def stats(self) -> ReadStats:
        return self.inner.stats

    def chunks(self) -> Iterator[Chunk]:
        for chunk in self.inner.chunks():
            yield unroll_chunk(chunk, self.inner.spec)
