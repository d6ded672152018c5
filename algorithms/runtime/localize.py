"""Batches localized for the embedding PS: a batch's ids remapped to the rows it touches.

`localize` is what every host-async worker batch goes through before its pull (``ps.py``);
on the virtual clock it runs once per worker event, so its cost is the simulator's (issue 35).
"""

from __future__ import annotations

import numpy as np

from recjax.batch import Batch
from recjax.embeddings import EmbeddingLayout

# table name -> (unique ids padded with V to the table's fixed size, number of real ids)
Rows = dict[str, tuple[np.ndarray, int]]


def localize(layout: EmbeddingLayout, batch: Batch) -> tuple[Batch, Rows]:
    """Remap a batch's ids to rows of per-batch *mini tables* (the touched rows only).

    For each set of fields sharing a table (``emb/x`` and ``wide/x`` share it too) the unique
    ids are padded with ``V`` to the fixed size ``B * fields * L`` (jit-friendly), and the batch's
    ids become indices into them. Returns ``(local batch, rows)``.
    """
    sets: dict[tuple[int, ...], int] = {}  # field set -> V of its first table
    for t in layout.tables:
        sets.setdefault(t.field_index, t.num_embeddings)
    one_field = all(len(idx) == 1 for idx in sets) and len({i[0] for i in sets}) == len(sets)
    fast = _localize_fields(batch.ids, sets) if one_field else {}
    # mini-table rows (raw ids may be int64); with `fast`, a field without a table keeps its id
    local = batch.ids.astype(np.int32) if fast else np.empty(batch.ids.shape, np.int32)
    done: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
    for idx, v in sets.items():
        if idx in fast:
            padded, n, inv = fast[idx]
            local[:, idx, :] = inv
        else:
            ids = batch.ids[:, idx, :]
            uniq, inv = np.unique(ids, return_inverse=True)
            local[:, idx, :] = inv.reshape(ids.shape)
            padded, n = np.full(ids.size, v, np.int64), uniq.size
            padded[:n] = uniq
        done[idx] = (padded, n)
    return batch._replace(ids=local), {t.name: done[t.field_index] for t in layout.tables}


def _localize_fields(ids: np.ndarray, sets: dict[tuple[int, ...], int]) -> dict:
    """`localize` of one-field sets, every field at once: ``field set -> (padded unique ids,
    count, local ids i64[B, 1, L])``, what a `np.unique` per field gives, in a dozen numpy
    calls for all of them (a 32-row virtual-clock worker batch localizes per event; issue 35)."""
    fields = [idx[0] for idx in sets]
    b, _, length = ids.shape
    x = np.ascontiguousarray(ids[:, fields, :].transpose(1, 0, 2).reshape(len(fields), -1))
    order = np.argsort(x, axis=1, kind="stable")
    s = np.take_along_axis(x, order, axis=1)
    first = np.ones(s.shape, bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]  # the first of each run of equal ids
    rank = np.cumsum(first, axis=1) - 1  # each sorted id's row in its mini table
    inv = np.empty_like(rank)
    np.put_along_axis(inv, order, rank, axis=1)
    padded = np.repeat(np.fromiter(sets.values(), np.int64, len(sets))[:, None], x.shape[1], 1)
    g, _ = np.nonzero(first)
    padded[g, rank[first]] = s[first]
    counts = rank[:, -1] + 1 if x.shape[1] else np.zeros(len(sets), np.int64)
    return {idx: (padded[i], int(counts[i]), inv[i].reshape(b, 1, length))
            for i, idx in enumerate(sets)}
