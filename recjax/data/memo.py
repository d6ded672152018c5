"""Values a process makes once and reads many times: the synthetic teacher's chunks.

A study runs hundreds of segments in one process (`recjax.study.runner`), each a run that
opens its data afresh; on the synthetic teacher each one generated the same 1M eval rows twice
(the eval pass, then the teacher's probabilities for ``eval_kl_to_bayes``) and the Bayes
predictor's metrics again: ~3 s of a ~6 s GBA study segment on the 2-core box
(docs/performance.md, "A study's segments"). What is generated is a pure function of its key
(the split's `SyntheticConfig`, the split, the chunk), so it is kept here, in a bounded LRU
shared by every source of the process, and handed out read-only: a caller that wrote into a
kept array would change every later run's data, and gets numpy's "assignment destination is
read-only" instead.

It is on where it pays and off elsewhere: a study (`recjax.study.runner.run_study`) turns it
on at 512 MB, and a single run keeps nothing (a Ray actor or a training run that reads its data
once would only hold it longer). ``RECJAX_SYNTHETIC_CACHE_MB`` sets the budget everywhere (0:
off, nothing kept or made read-only). It changes what is kept, never a value: every run sees
the same arrays as with no memo (tests/test_data_memo.py, scripts/bench_study.py).
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np


def _arrays(value: Any) -> list[np.ndarray]:
    """The numpy arrays of `value` (an array, or tuples / named tuples / dicts of them)."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _arrays(v)]
    return []


class Memo:
    """A bounded, thread-safe LRU of values made by ``make()`` under a hashable key.

    Args:
      budget_bytes: the most bytes of arrays kept; a value larger than it is made, handed
        out and not kept. 0 keeps nothing.
    """

    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value kept under `key`, or ``make()``'s, read-only (kept when it fits)."""
        if self.budget <= 0:
            return make()
        with self._lock:
            kept = self._items.get(key)
            if kept is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return kept[0]
            self.misses += 1
        # made outside the lock (slow); two threads that miss together make the same value
        value = make()
        arrays = _arrays(value)
        for a in arrays:
            a.setflags(write=False)
        nbytes = sum(a.nbytes for a in arrays)
        with self._lock:
            if key not in self._items and nbytes <= self.budget:
                self._items[key] = (value, nbytes)
                self._bytes += nbytes
                while self._bytes > self.budget:
                    _, (_, n) = self._items.popitem(last=False)
                    self._bytes -= n
        return value

    @property
    def nbytes(self) -> int:
        return self._bytes


ENV = "RECJAX_SYNTHETIC_CACHE_MB"
STUDY_MB = 512  # a study's budget: the GBA study's full size keeps ~170 MB


def _mb(default: float) -> int:
    return int(float(os.environ.get(ENV, default)) * 2**20)


SYNTHETIC = Memo(_mb(0))


def for_study() -> None:
    """A study's many runs in this process: keep `STUDY_MB` of synthetic chunks (or what
    ``RECJAX_SYNTHETIC_CACHE_MB`` says)."""
    SYNTHETIC.budget = _mb(STUDY_MB)
