"""What GBA's PS counts (summary.json, metrics.jsonl) and how a run's counters add up across
its checkpoint intervals and resumes (`contract.add_counts`); `algorithms/gba.py`'s
`GbaServer` keeps a `Stats` and reports through `whole_run`."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from algorithms.runtime import histogram_summary
from recjax.train.contract import add_counts


class Stats:
    """What the PS counts (summary.json / metrics.jsonl). Attributes:
      applied: gradients aggregated into an update.
      dropped: gradients dropped whole (Eq. 1's f = 0, or late in hop_bw).
      dropped_rows: embedding rows dropped by the per-id rule (``embedding_staleness=id``).
      updates: optimizer steps applied by the PS.
      dense_staleness: Counter of ``version at apply - version pulled`` of applied gradients.
      emb_staleness: bincount of the per-row staleness of applied rows (updates of the row's
        global step after the worker pulled it).
    """

    def __init__(self):
        self.applied = self.dropped = self.dropped_rows = self.updates = 0
        self.dense_staleness: collections.Counter = collections.Counter()
        self.emb_staleness = np.zeros(1, np.int64)

    def add_rows(self, stale: np.ndarray) -> None:
        counts = np.bincount(stale)
        if counts.size > self.emb_staleness.size:
            counts[:self.emb_staleness.size] += self.emb_staleness
            self.emb_staleness = counts
        else:
            self.emb_staleness[:counts.size] += counts


# the summary's counters that add up over a run's checkpoint intervals and resumes
_ADDITIVE = ("updates", "gradients_applied", "dropped_gradients", "dropped_embedding_rows",
             "tokens_handed_out")


def additive(counters: dict, iterations: list[int]) -> dict:
    """What `GbaServer.counters` reports that adds up across calls (`contract.add_counts`)."""
    return {**{k: counters[k] for k in _ADDITIVE},
            "dense_staleness": counters["dense_staleness"]["histogram"],
            "embedding_staleness": counters["embedding_staleness"]["histogram"],
            "worker_iterations": {str(w): it for w, it in enumerate(iterations)}}


def whole_run(rt: Any, local_batch: int, counters: dict, iterations: list[int],
              seconds: float) -> dict:
    """This call's `counters` made the whole run's: added to the checkpoint's
    (`engine.Runtime.base_counts` of `rt`), rates over the run's training seconds (`local_batch`
    examples per worker iteration). A fresh run's are its own."""
    base = rt.base_counts
    if not base:
        return counters
    tot = add_counts(base, additive(counters, iterations))
    secs = max(rt.progress.train_seconds + seconds, 1e-12)
    its = [tot["worker_iterations"].get(str(w), 0) for w in range(len(iterations))]
    local = [it * local_batch / secs for it in its]
    return {**counters, **{k: tot[k] for k in _ADDITIVE},
            "global_qps": sum(local), "local_qps": local, "local_qps_mean": sum(local) / len(local),
            "dense_staleness": histogram_summary(
                {int(k): v for k, v in tot["dense_staleness"].items()}),
            "embedding_staleness": histogram_summary(
                {int(k): v for k, v in tot["embedding_staleness"].items()})}
