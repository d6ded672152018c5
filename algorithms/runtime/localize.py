"""Batches localized for the embedding PS: a batch's ids remapped to the rows it touches.

`localize` is what every host-async worker batch goes through before its pull (``ps.py``);
on the virtual clock it runs once per worker event, so its cost is the simulator's (issue 35).
"""

from __future__ import annotations

import functools

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
    sets, names, fields, vocab = _plan(layout)
    if fields is not None:  # every set is one field of its own: all of them at once
        return _localize_fields(batch, names, fields, vocab)
    local = np.empty(batch.ids.shape, np.int32)
    done: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
    for idx, v in sets.items():
        ids = batch.ids[:, idx, :]
        uniq, inv = np.unique(ids, return_inverse=True)
        local[:, idx, :] = inv.reshape(ids.shape)
        padded, n = np.full(ids.size, v, np.int64), uniq.size
        padded[:n] = uniq
        done[idx] = (padded, n)
    return batch._replace(ids=local), {name: done[idx] for name, idx in names}


@functools.lru_cache(maxsize=64)
def _plan(layout: EmbeddingLayout) -> tuple:
    """What `localize` reads of a layout, worked out once per layout (it runs per worker batch):
    ``(field set -> V of its first table, ((table, its set or set number), ...), the sets'
    fields i64[S] or None, their V i64[S, 1])``; the fields are None unless every set is one
    field of its own (then the names map to set numbers)."""
    sets: dict[tuple[int, ...], int] = {}  # field set -> V of its first table
    for t in layout.tables:
        sets.setdefault(t.field_index, t.num_embeddings)
    if all(len(idx) == 1 for idx in sets) and len({i[0] for i in sets}) == len(sets):
        number = {idx: i for i, idx in enumerate(sets)}
        return (sets, tuple((t.name, number[t.field_index]) for t in layout.tables),
                np.array([idx[0] for idx in sets], np.int64),
                np.fromiter(sets.values(), np.int64, len(sets))[:, None])
    return sets, tuple((t.name, t.field_index) for t in layout.tables), None, None


def _localize_fields(batch: Batch, names: tuple, fields: np.ndarray, vocab: np.ndarray
                     ) -> tuple[Batch, Rows]:
    """`localize` of one-field sets, every field at once: what a `np.unique` per field gives,
    in a dozen numpy calls for all of them (a 32-row virtual-clock worker batch localizes per
    event; issue 35). A field without a table keeps its id."""
    ids = batch.ids
    b, _, length = ids.shape
    f = fields.size
    x = ids[:, fields, :].transpose(1, 0, 2).reshape(f, -1)  # a copy: set i's ids in a row
    order = np.argsort(x, axis=1, kind="stable")
    at = np.arange(f)[:, None]
    s = x[at, order]
    first = np.ones(s.shape, bool)
    np.not_equal(s[:, 1:], s[:, :-1], out=first[:, 1:])  # the first of each run of equal ids
    rank = np.cumsum(first, axis=1)
    rank -= 1  # each sorted id's row in its mini table
    inv = np.empty_like(rank)
    inv[at, order] = rank
    padded = np.repeat(vocab, x.shape[1], 1)
    g, _ = np.nonzero(first)
    padded[g, rank[first]] = s[first]
    counts = (rank[:, -1] + 1).tolist() if x.shape[1] else [0] * f
    local = ids.astype(np.int32)  # mini-table rows (raw ids may be int64)
    local[:, fields, :] = inv.reshape(f, b, length).transpose(1, 0, 2)
    return batch._replace(ids=local), {name: (padded[i], counts[i]) for name, i in names}
