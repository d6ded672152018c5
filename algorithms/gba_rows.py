"""GBA's aggregation of one global step's gradients (App. B Alg. 2 l. 21-23), as pure numpy:
the dense gradients summed in buffer order (l. 22), and each (table, id)'s embedding rows of
f = 1 summed in buffer order, divided by the gradients that met the id
(``embedding_mean=touched``) or by M (``buffer``). `gba.GbaServer` gathers the rows of every
table of one width, divides and pushes the results."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def by_dim(tables) -> list[list]:
    """The tables grouped by row width (their rows stack), each group in layout order."""
    groups: dict[int, list] = {}
    for t in tables:
        groups.setdefault(t.embedding_dim, []).append(t)
    return list(groups.values())


def aggregate(ids: np.ndarray, tix: np.ndarray, g: np.ndarray, ok: np.ndarray, touched_mean: bool,
              n_entries: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, tables, rows)`` of every (table, id) with a row of f = 1, sorted by (table, id).

    Args:
      ids, tix: each row's id and table index, in table then buffer order.
      g: the rows' gradients ``[N, D]``; ok: each row's f (l. 21).
      touched_mean: divide by the gradients that met the id, dropped rows included (l. 23),
        else by `n_entries` (M).
    """
    order = np.lexsort((ids, tix))  # stable: equal ids in buffer (index) order
    ids, tix, g, ok = ids[order], tix[order], g[order], ok[order]
    if ids.size:
        new = np.r_[True, (ids[1:] != ids[:-1]) | (tix[1:] != tix[:-1])]
        starts = np.flatnonzero(new)
        touched = np.diff(np.r_[starts, ids.size])  # gradients that met each id
        alive = np.add.reduceat(ok, starts) > 0  # ids with a row of f = 1
    else:
        touched, alive = np.zeros(0, np.int64), np.zeros(0, bool)
    ids, tix, g = ids[ok], tix[ok], g[ok]
    if ids.size:
        starts = np.flatnonzero(np.r_[True, (ids[1:] != ids[:-1]) | (tix[1:] != tix[:-1])])
        uniq, utix = ids[starts], tix[starts]
        summed = np.add.reduceat(g, starts, axis=0)
    else:  # every row of these tables was dropped as stale
        uniq, utix, summed = ids, tix, g
    if touched_mean:
        summed /= touched[alive][:, None].astype(np.float32)
    else:
        summed /= np.float32(n_entries)
    return uniq, utix, summed


def tree_sum(trees: list) -> Any:
    """``((t0 + t1) + t2) + ...`` leaf by leaf, in numpy: the sum the update divides by M
    (Alg. 2 l. 22), added in buffer order. Each tree is flattened once and the partial sums are
    added into in place (a global step sums 32 gradients of ~25 leaves: issue 35)."""
    if len(trees) == 1:
        return trees[0]
    leaves, tree = jax.tree.flatten(trees[0])
    acc = [np.asarray(np.add(a, b)) for a, b in zip(leaves, jax.tree.leaves(trees[1]))]
    for t in trees[2:]:
        for a, b in zip(acc, jax.tree.leaves(t)):
            np.add(a, b, out=a)
    return jax.tree.unflatten(tree, acc)
