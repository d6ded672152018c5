"""Synthetic CTR data from a known teacher, so the best achievable NE is known.

Each categorical field draws ids from a truncated Zipf law (rank r has probability proportional
to (r + 1)^-s), mapped through a fixed per-field bijection so popular ids are spread over the
table as hashing would spread them. Dense features are log1p of log-normal counts. The label is
Bernoulli(sigmoid(z + eps)) with the teacher logit

    z = bias + sum_f w_f[id_f] + sum_{f<g} <v_f[id_f], v_g[id_g]> + u . dense,   eps ~ N(0, noise^2)

(first-order + pairwise factorised terms, like an FM). The Bayes-optimal predictor is
p*(x) = E_eps[sigmoid(z + eps)] (Gauss-Hermite quadrature; exactly sigmoid(z) without noise), and
its NE on the eval stream is the floor any model can reach (`bayes_optimal`).

Streams are deterministic functions of (seed, split, chunk index): every process and machine
generates the same examples.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk, take
from recjax.concurrency import ordered_map
from recjax.config_fields import RESUMABLE, check_choices
from recjax.data import memo
from recjax.data.base import ReadStats, count_rows, even_chunk_sizes
from recjax.features import FeatureSpec, FieldSpec

# Criteo Kaggle cardinalities (DLRM's preprocessing), used by the "criteo" preset.
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """A synthetic task (select a preset with ``--data synthetic:NAME``).

    Attributes:
      name: preset name, recorded in summary.json.
      n_dense: dense features.
      cardinalities: vocabulary size of each categorical field.
      zipf: Zipf exponent s of the id distribution (larger = more skewed).
      teacher_dim: dimension k of the teacher's pairwise factors.
      first_order_std: std of the teacher's first-order weights w.
      pairwise_std: std of the teacher's factor entries v (pairwise term std ~ sqrt(P k) std^2).
      dense_std: std of the teacher's dense weights u.
      bias: teacher bias (sets the click rate).
      noise: std of the unobserved logit noise eps.
      n_train: training examples per epoch.
      n_eval: eval examples.
      seed: seed of the teacher and of the example streams.
      teacher: whether labels come from the teacher (False: labels Bernoulli(0.25); only for
        throughput runs on huge tables, where building the teacher would cost memory).
      days: the training stream is this many days of ``n_train / days`` examples, in order
        (example r is of day ``r * days // n_train``); the eval stream is day ``days``, the day
        after the last.
      drift: how far the teacher moves from one day to the next: every weight follows
        ``x_{d+1} = sqrt(1 - drift^2) x_d + drift * std * e_d``, e_d ~ N(0, 1) (a stationary
        AR(1): each day's weights have the preset's stds; 0 = one teacher for every day, 1 = a
        fresh teacher each day).
      eval_day: the day the eval stream's examples are of (-1 = ``days``, the day after the
        last). A ``--resume`` may change it: day after day, train day t and evaluate day t + 1
        (next-day evaluation, GBA's Criteo-1TB protocol).
    """

    name: str = "default"
    n_dense: int = 13
    cardinalities: tuple[int, ...] = (4, 10, 25, 50, 100, 250, 500, 1000)
    zipf: float = 1.1
    teacher_dim: int = 2
    first_order_std: float = 0.3
    pairwise_std: float = 0.35
    dense_std: float = 0.2
    bias: float = -1.0
    noise: float = 0.0
    n_train: int = 1_000_000
    n_eval: int = 100_000
    seed: int = 1234
    teacher: bool = True
    days: int = 1
    drift: float = 0.0
    eval_day: int = dataclasses.field(default=-1, metadata=RESUMABLE)

    def __post_init__(self):
        check_choices(self, "synthetic")
        if self.days < 1 or not 0.0 <= self.drift <= 1.0:
            raise ValueError(f"synthetic.days must be >= 1 and synthetic.drift in [0, 1], got "
                             f"{self.days} and {self.drift}")
        if not -1 <= self.eval_day <= self.days:
            raise ValueError(f"synthetic.eval_day must be in [0, days={self.days}] (or -1: the "
                             f"day after the last), got {self.eval_day}")
        if not self.cardinalities or min(self.cardinalities) < 1:
            raise ValueError("synthetic.cardinalities must be non-empty, each >= 1")
        if self.zipf <= 0:
            raise ValueError(f"synthetic.zipf must be > 0, got {self.zipf}")
        if self.n_train < 1 or self.n_eval < 1:
            raise ValueError("synthetic.n_train and synthetic.n_eval must be >= 1")


PRESETS: dict[str, SyntheticConfig] = {
    "default": SyntheticConfig(),
    "smoke": SyntheticConfig(name="smoke", n_dense=4, cardinalities=(10, 50, 200, 1000),
                             n_train=50_000, n_eval=10_000),
    # Criteo-Kaggle-shaped (DLRM's 26 tables, x0.5), no teacher: for throughput measurements.
    "criteo": SyntheticConfig(name="criteo", n_dense=13,
                              cardinalities=tuple(max(c // 2, 1) for c in CRITEO_KAGGLE_CARDINALITIES),
                              zipf=1.05, n_train=4_000_000, n_eval=100_000, teacher=False),
    # 26 fields with a teacher: for convergence studies at Criteo's field count.
    "criteo_teacher": SyntheticConfig(name="criteo_teacher", n_dense=13,
                                      cardinalities=(1000,) * 13 + (20000,) * 13,
                                      pairwise_std=0.15, first_order_std=0.2,
                                      n_train=2_000_000),
}


def synthetic_name(spec: str) -> str | None:
    """The preset a data spec names: "default" for ``synthetic``, NAME for ``synthetic:NAME``,
    None for every other kind of data."""
    if spec == "synthetic":
        return "default"
    return spec.partition(":")[2] if spec.startswith("synthetic:") else None


def preset(name: str) -> SyntheticConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown synthetic data {name!r}; presets: {sorted(PRESETS)}")
    return PRESETS[name]


class Teacher:
    """The label model's parameters, drawn once from ``cfg.seed`` (day 0; `drifted` gives the
    next day's)."""

    def __init__(self, cfg: SyntheticConfig):
        rng = np.random.default_rng([cfg.seed, 7])
        self.w = [rng.normal(0, cfg.first_order_std, c).astype(np.float32) for c in cfg.cardinalities]
        self.v = [rng.normal(0, cfg.pairwise_std, (c, cfg.teacher_dim)).astype(np.float32)
                  for c in cfg.cardinalities]
        self.u = rng.normal(0, cfg.dense_std, cfg.n_dense).astype(np.float32)
        self.bias = np.float32(cfg.bias)

    def drifted(self, cfg: SyntheticConfig, day: int) -> Teacher:
        """The teacher of day ``day`` from this one of day ``day - 1``: every weight
        ``x <- sqrt(1 - drift^2) x + drift * std * e``, e ~ N(0, 1) drawn from
        ``(seed, 8, day)`` (the bias stays: the click rate keeps its scale)."""
        rng = np.random.default_rng([cfg.seed, 8, day])
        a, b = np.sqrt(1.0 - cfg.drift ** 2), cfg.drift

        def move(x: np.ndarray, std: float) -> np.ndarray:
            return (a * x + b * std * rng.normal(0, 1, x.shape)).astype(np.float32)

        out = object.__new__(Teacher)
        out.w = [move(x, cfg.first_order_std) for x in self.w]
        out.v = [move(x, cfg.pairwise_std) for x in self.v]
        out.u = move(self.u, cfg.dense_std)
        out.bias = self.bias
        return out

    def logits(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """z for dense f32[N, n_dense] and one-hot ids i32[N, F]."""
        z = self.bias + dense @ self.u
        vsum = np.zeros((ids.shape[0], self.v[0].shape[1]), np.float32)
        vsq = np.zeros(ids.shape[0], np.float32)
        for f in range(ids.shape[1]):
            z = z + self.w[f][ids[:, f]]
            vf = self.v[f][ids[:, f]]
            vsum += vf
            vsq += (vf * vf).sum(1)
        # sum_{f<g} <v_f, v_g> = 0.5 (|sum_f v_f|^2 - sum_f |v_f|^2)
        return z + 0.5 * ((vsum * vsum).sum(1) - vsq)


def bayes_probs(z: np.ndarray, noise: float) -> np.ndarray:
    """p*(x) = E[sigmoid(z + eps)], eps ~ N(0, noise^2), by 40-point Gauss-Hermite quadrature."""
    if noise == 0:
        return 1.0 / (1.0 + np.exp(-z.astype(np.float64)))
    t, wts = np.polynomial.hermite.hermgauss(40)
    zz = z.astype(np.float64)[:, None] + np.sqrt(2.0) * noise * t[None, :]
    return (wts[None, :] / (1.0 + np.exp(-zz))).sum(1) / np.sqrt(np.pi)


class _ZipfSampler:
    """Truncated Zipf ranks via the inverse CDF, then a fixed bijection rank -> id.

    The inverse CDF is ``searchsorted(cdf, u, "right")`` computed through a guide table
    (Chen & Asau's indexed search): ``guide[j]`` is the answer for ``u = j / K``, so the answer
    for ``u`` in ``[j / K, (j + 1) / K)`` lies in ``[guide[j], guide[j + 1]]`` and a few
    vectorised bisection steps inside that bracket find it. Same ranks as the plain binary
    search over a CDF of up to millions of entries; the whole chunk generates 2x faster (the
    input pipeline's main cost; docs/performance.md).
    """

    def __init__(self, card: int, s: float, field: int, seed: int):
        p = (np.arange(1, card + 1, dtype=np.float64)) ** -s
        self.cdf = np.cumsum(p / p.sum())
        self.card = card
        # K a power of two: u * K and j / K are exact in float64, so the bracket is exact.
        # ~4 entries per bucket for large tables (memory), <= 1/4 per bucket for small ones.
        bits = int(card - 1).bit_length()
        self.k = 1 << (bits - 2 if bits > 16 else max(bits + 2, 8))
        self.guide = np.searchsorted(self.cdf, np.arange(self.k + 1) / self.k, side="right")
        self.guide = np.minimum(self.guide, card).astype(np.int64)
        # id = (a * rank + c) mod card with gcd(a, card) = 1 is a bijection.
        rng = np.random.default_rng([seed, 11, field])
        a = int(rng.integers(1, max(card, 2)))
        while np.gcd(a, card) != 1:
            a += 1
        self.a, self.c = a, int(rng.integers(0, card))

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """``min(searchsorted(cdf, u, "right"), card - 1)`` for u in [0, 1)."""
        j = (u * self.k).astype(np.int64)
        lo, hi = self.guide[j], self.guide[j + 1]
        # Bisect only the open brackets (15-30% of draws; the rest are answered by the guide
        # table), dropping each as it closes: 1.7x faster than stepping every draw.
        idx = np.flatnonzero(lo < hi)
        a, z, v = lo[idx], hi[idx], u[idx]
        while idx.size:  # first index in [lo, hi) with cdf > u (hi if none)
            mid = (a + z) >> 1
            right = self.cdf[np.minimum(mid, self.card - 1)] <= v
            a, z = np.where(right, mid + 1, a), np.where(right, z, mid)
            done = a >= z
            if done.any():
                lo[idx[done]] = a[done]
                keep = ~done
                idx, a, z, v = idx[keep], a[keep], z[keep], v[keep]
        return np.minimum(lo, self.card - 1)

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ranks = self.ranks(rng.random(n))
        return ((ranks * self.a + self.c) % self.card).astype(np.int32)


# Samplers alive in this process, shared by every source that draws the same field: a
# sampler is read-only once built, and a Criteo-sized field's CDF and guide table are ~10 B per
# id (the train and eval streams of `synthetic:criteo` held two copies, 350 MB).
_SAMPLERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _sampler(card: int, s: float, field: int, seed: int) -> _ZipfSampler:
    key = (card, s, field, seed)
    got = _SAMPLERS.get(key)
    if got is None:
        got = _SAMPLERS[key] = _ZipfSampler(card, s, field, seed)
    return got


class SyntheticSource:
    """`DataSource` of a synthetic split ("train" or "eval"); see the module docstring."""

    CHUNK = 65536

    def __init__(self, cfg: SyntheticConfig, split: str = "train", workers: int = 1):
        """`workers` threads generate chunks ahead (`concurrency.ordered_map`); the stream is
        the same for any number."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be train or eval, got {split!r}")
        self.cfg, self.split, self.workers = cfg, split, workers
        self.name = f"synthetic:{cfg.name}" + ("" if split == "train" else " (eval stream)")
        self.spec = FeatureSpec(
            dense_names=tuple(f"I{i + 1}" for i in range(cfg.n_dense)),
            fields=tuple(FieldSpec(f"C{i + 1}", c) for i, c in enumerate(cfg.cardinalities)))
        self.stats = ReadStats()
        self.num_rows = cfg.n_train if split == "train" else cfg.n_eval
        self._samplers = [_sampler(c, cfg.zipf, f, cfg.seed)
                          for f, c in enumerate(cfg.cardinalities)]

    @functools.cached_property
    def teacher(self) -> Teacher:
        return _teacher(self.cfg)

    def days(self, rows: np.ndarray) -> np.ndarray:
        """The day of each example row (the eval stream is day ``cfg.days``)."""
        if self.split == "eval":
            day = self.cfg.days if self.cfg.eval_day < 0 else self.cfg.eval_day
            return np.full(rows.shape, day, np.int64)
        return rows * self.cfg.days // self.num_rows

    def _logits(self, dense: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        if self.cfg.drift == 0 or (self.cfg.days == 1 and self.split == "train"):
            return self.teacher.logits(dense, ids)  # one teacher (eval_day then changes nothing)
        day = self.days(rows)
        z = np.empty(rows.shape, np.float32)
        for d in np.unique(day):
            at = day == d
            z[at] = day_teacher(self.cfg, int(d)).logits(dense[at], ids[at])
        return z

    def _generate(self, index: int, n: int) -> tuple[Chunk, np.ndarray]:
        """Chunk `index` (`n` examples) and its Bayes-optimal probabilities: made once per
        process and read-only (`recjax.data.memo`: a pure function of the key)."""
        return memo.SYNTHETIC.get((self.cfg, self.split, index, n),
                                  lambda: self._make(index, n))

    def _make(self, index: int, n: int) -> tuple[Chunk, np.ndarray]:
        rng = np.random.default_rng([self.cfg.seed, 0 if self.split == "train" else 1, index])
        counts = np.floor(rng.lognormal(1.0, 1.5, (n, self.cfg.n_dense)))
        dense = np.log1p(counts).astype(np.float32)
        ids = np.stack([s(rng, n) for s in self._samplers], axis=1)
        if self.cfg.teacher:
            rows = np.arange(index * self.CHUNK, index * self.CHUNK + n, dtype=np.int64)
            z = self._logits(dense, ids, rows)
            p = bayes_probs(z, self.cfg.noise)
        else:
            p = np.full(n, 0.25)
        label = (rng.random(n) < p).astype(np.float32)
        row = np.arange(index * self.CHUNK, index * self.CHUNK + n, dtype=np.int64)
        return Chunk(dense, ids[:, :, None], None, label, row), p

    def _stream(self, first: int = 0) -> Iterator[tuple[Chunk, np.ndarray]]:
        """(chunk, Bayes-optimal probabilities of its examples), in order, from chunk `first`."""
        starts = range(0, self.num_rows, self.CHUNK)
        yield from ordered_map(lambda i: self._generate(i, min(self.CHUNK, self.num_rows - starts[i])),
                               range(first, len(starts)), self.workers)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """A pass; from example `start` on when given (its chunk is generated and sliced)."""
        self.stats = ReadStats()
        for chunk, _ in self._stream(start // self.CHUNK):
            if start > chunk.row[0]:
                chunk = take(chunk, slice(start - int(chunk.row[0]), None))
            self.stats.rows += chunk.size
            self.rows_read += chunk.size
            yield chunk

    # ------------------------------------------------------------------ seeking (recjax.data.seek)
    rows_read = 0  # examples generated for passes and takes (an instance attribute once counted)

    def seekable(self) -> bool:
        return True

    def chunk_sizes(self) -> list[int]:
        return even_chunk_sizes(self.num_rows, self.CHUNK)

    def chunk_row_ids(self, c: int) -> np.ndarray:
        lo = c * self.CHUNK
        return np.arange(lo, min(lo + self.CHUNK, self.num_rows), dtype=np.int64)

    def take_rows(self, positions: np.ndarray) -> Chunk:
        from recjax.data.seek import gather

        def read(c: int) -> Chunk:  # the last chunk is kept: a block after block makes it once
            last = getattr(self, "_last", (None,))  # one read: safe when threads share it
            if last[0] != c:
                count_rows(self, self.chunk_sizes()[c])
                last = self._last = (c, self._generate(c, self.chunk_sizes()[c])[0])
            return last[1]

        return gather(self.chunk_sizes(), read, positions)

    KEEP_BAYES_ROWS = 4_000_000  # splits up to this many rows keep (labels, p*) once made

    def labels_and_bayes_probs(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels of this split and the Bayes-optimal p*(x) of each example, in stream order
        (generated once and kept for a split of at most `KEEP_BAYES_ROWS` rows: each eval of
        a run scores against them)."""
        kept = self.__dict__.get("_bayes")
        if kept is not None:
            return kept

        def make():
            pairs = list(self._stream())
            return (np.concatenate([c.label for c, _ in pairs]),
                    np.concatenate([p for _, p in pairs]))

        out = memo.SYNTHETIC.get((self.cfg, self.split, "labels_and_bayes_probs"), make)
        for a in out:
            a.setflags(write=False)
        if self.num_rows <= self.KEEP_BAYES_ROWS:
            self._bayes = out
        return out

    def bayes_optimal(self) -> dict:
        """Metrics of the Bayes-optimal predictor p* on this split's examples (once per
        process)."""
        return dict(memo.SYNTHETIC.get((self.cfg, self.split, "bayes_optimal"),
                                       lambda: _metrics(*self.labels_and_bayes_probs())))

    def bayes_optimal_by_day(self) -> dict[int, dict]:
        """The same for each day's examples (the training stream's days, or the eval day)."""
        y, p = self.labels_and_bayes_probs()
        day = self.days(np.arange(y.size, dtype=np.int64))
        return {int(d): _metrics(y[day == d], p[day == d]) for d in np.unique(day)}


def _metrics(y: np.ndarray, p: np.ndarray) -> dict:
    from recjax.metrics import auc, logloss, normalized_entropy

    return {"ne": float(normalized_entropy(y, p)), "logloss": float(logloss(y, p)),
            "auc": float(auc(y, p))}


@functools.lru_cache(maxsize=64)
def day_teacher(cfg: SyntheticConfig, day: int) -> Teacher:
    """The teacher of day `day`: day 0's, drifted once per day (`Teacher.drifted`)."""
    return _teacher(cfg) if day == 0 else day_teacher(cfg, day - 1).drifted(cfg, day)


@functools.lru_cache(maxsize=4)
def _teacher(cfg: SyntheticConfig) -> Teacher:
    return Teacher(cfg)
