"""Seeded straggler models: a slowdown factor for every (worker, iteration).

A model is parsed from ``--stragglers SPEC``; SPEC is one term or several joined by ``+``
(their factors multiply):

    none                              every factor 1
    lognormal:sigma=0.5               i.i.d. exp(sigma * N(0, 1)) per iteration (median 1)
    slow:k=2,factor=4                 k workers (chosen by the seed) always `factor` x slower
    shift:k=1,factor=4,period=100     time-varying: in each window of `period` iterations a
                                      fresh seeded choice of k workers is `factor` x slower

The factor is a pure function of ``(seed, worker, iteration)``, so the threaded runtime (which
sleeps ``(factor - 1) x`` the measured compute time) and the virtual clock (which multiplies the
modelled compute time) see the same slowdowns, and a rerun with the same seed repeats them.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

_KINDS = {"none": {}, "lognormal": {"sigma": 0.5},
          "slow": {"k": 1, "factor": 4.0}, "shift": {"k": 1, "factor": 4.0, "period": 100}}


@dataclasses.dataclass(frozen=True)
class Term:
    """One term of a straggler SPEC.

    Attributes:
      kind: none | lognormal | slow | shift.
      params: the term's parameters (see the module docstring).
    """

    kind: str
    params: tuple[tuple[str, float], ...] = ()

    def get(self, key: str) -> float:
        return dict(self.params).get(key, _KINDS[self.kind][key])


@dataclasses.dataclass(frozen=True)
class StragglerModel:
    """Slowdown factors for `num_workers` workers; `factor` is deterministic in the seed.

    Attributes:
      terms: the parsed terms; their factors multiply.
      num_workers: workers in the run (slow/shift choose among them).
      seed: seeds every draw.
    """

    terms: tuple[Term, ...]
    num_workers: int
    seed: int

    def factor(self, worker: int, iteration: int) -> float:
        """Slowdown (>= 0, 1 = nominal speed) of `worker` at its `iteration`."""
        f = 1.0
        for i, t in enumerate(self.terms):
            if t.kind == "lognormal":
                f *= float(np.exp(t.get("sigma") * normal(self.seed, i, worker, iteration)))
            elif t.kind == "slow":
                if worker in self._chosen(i, 0, int(t.get("k"))):
                    f *= t.get("factor")
            elif t.kind == "shift":
                window = iteration // max(int(t.get("period")), 1)
                if worker in self._chosen(i, window + 1, int(t.get("k"))):
                    f *= t.get("factor")
        return f

    def _chosen(self, term: int, window: int, k: int) -> frozenset[int]:
        return _choice(self.seed, term, window, self.num_workers, k)

    @property
    def active(self) -> bool:
        return any(t.kind != "none" for t in self.terms)


@functools.lru_cache(maxsize=4096)
def _choice(seed: int, term: int, window: int, num_workers: int, k: int) -> frozenset[int]:
    """The `k` workers a slow/shift term slows in `window`: drawn once, not once per call (the
    virtual clock asks for every worker's factor at every iteration; issue 35)."""
    rng = np.random.default_rng([seed, 23, term, window])
    k = min(max(k, 0), num_workers)
    return frozenset(rng.choice(num_workers, size=k, replace=False).tolist())


def normal(seed: int, term: int, worker: int, iteration: int) -> float:
    """The lognormal term's N(0, 1) draw: ``default_rng([seed, 17, term, worker,
    iteration]).standard_normal()``, from a block of `BLOCK` iterations drawn at once."""
    key = (seed, 17, term, worker)
    if not all(0 <= x <= _M32 for x in (*key, iteration + BLOCK)):
        return float(np.random.default_rng([*key, iteration]).standard_normal())
    return _normals(key, iteration // BLOCK)[iteration % BLOCK]


BLOCK = 256  # iterations per block of draws
_M32 = 0xFFFFFFFF
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's 128-bit LCG multiplier
_M128 = (1 << 128) - 1
_LOCK = threading.Lock()  # the one generator below is reseeded per draw
_GEN = np.random.Generator(np.random.PCG64(0))


@functools.lru_cache(maxsize=2048)
def _normals(key: tuple[int, ...], block: int) -> list[float]:
    """``default_rng([*key, i]).standard_normal()`` for the `BLOCK` iterations i of `block`,
    as Python floats. The draws are the same numbers: the generators' states are computed as
    numpy seeds them (`SeedSequence` of the entropy words, 4 x u64 of its state, PCG64's
    ``srandom``), `_seed_words` for the whole block at once, and one generator is set to each
    state in turn; what costs is building a generator per draw (~20 us; the virtual clock asks
    for one per worker event, issue 35). tests/test_stragglers.py compares with default_rng."""
    its = np.arange(block * BLOCK, (block + 1) * BLOCK, dtype=np.uint32)
    words = _seed_words(np.column_stack([np.broadcast_to(np.array(key, np.uint32),
                                                         (BLOCK, len(key))), its]))
    out = []
    with _LOCK:
        for w in words.tolist():
            initstate, initseq = (w[0] << 64) | w[1], (w[2] << 64) | w[3]
            inc = ((initseq << 1) | 1) & _M128
            state = ((inc + initstate) * _PCG_MULT + inc) & _M128  # srandom: two LCG steps
            _GEN.bit_generator.state = {"bit_generator": "PCG64", "has_uint32": 0,
                                        "uinteger": 0, "state": {"state": state, "inc": inc}}
            out.append(float(_GEN.standard_normal()))
    return out


def _seed_words(entropy: np.ndarray) -> np.ndarray:
    """``SeedSequence(row).generate_state(4, np.uint64)`` of each row of ``u32[n, L]`` (L >= 4
    one-word entropy values), for all rows at once: numpy's mixing (bit_generator.pyx,
    ``mix_entropy`` with its default pool of 4 words, then ``generate_state``) in u32 arrays."""
    n, length = entropy.shape
    h = 0x43B0D7E5  # INIT_A

    def hashmix(v):
        nonlocal h
        v = v ^ np.uint32(h)
        h = (h * 0x931E8875) & _M32  # MULT_A
        v = v * np.uint32(h)
        return v ^ (v >> np.uint32(16))

    def mix(x, y):
        r = np.uint32(0xCA01F9DD) * x - np.uint32(0x4973F715) * y
        return r ^ (r >> np.uint32(16))

    with np.errstate(over="ignore"):
        pool = [hashmix(entropy[:, i]) for i in range(4)]
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(4, length):
            for dst in range(4):
                pool[dst] = mix(pool[dst], hashmix(entropy[:, src]))
        hb, words = 0x8B51F9DD, []  # INIT_B
        for i in range(8):
            v = pool[i % 4] ^ np.uint32(hb)
            hb = (hb * 0x58F38DED) & _M32  # MULT_B
            v = v * np.uint32(hb)
            words.append(v ^ (v >> np.uint32(16)))
    return np.stack(words, 1).view(np.uint64)  # word pairs, little-endian as numpy's view


def parse(spec: str, num_workers: int, seed: int) -> StragglerModel:
    """Parse a straggler SPEC (module docstring) for `num_workers` workers.

    Raises:
      ValueError: unknown kind or parameter, or a value that is not a number.
    """
    terms = []
    for part in (spec or "none").split("+"):
        kind, _, rest = part.strip().partition(":")
        if kind not in _KINDS:
            raise ValueError(f"--stragglers {spec!r}: unknown model {kind!r}; "
                             f"models: {', '.join(_KINDS)} (join several with '+')")
        params = []
        for kv in filter(None, (x.strip() for x in rest.split(","))):
            key, _, val = kv.partition("=")
            if key not in _KINDS[kind]:
                raise ValueError(f"--stragglers {spec!r}: {kind} takes "
                                 f"{', '.join(_KINDS[kind]) or 'no parameters'}, not {key!r}")
            try:
                params.append((key, float(val)))
            except ValueError:
                raise ValueError(f"--stragglers {spec!r}: {key}={val!r} is not a number") from None
        terms.append(Term(kind, tuple(params)))
    return StragglerModel(tuple(terms), num_workers, seed)
