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
                rng = np.random.default_rng([self.seed, 17, i, worker, iteration])
                f *= float(np.exp(t.get("sigma") * rng.standard_normal()))
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
