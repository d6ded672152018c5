"""Facts about a study's training data, for ``Study.describe``.

`id_alpha` is the alpha of convergence bounds for sparse asynchronous updates: the largest
fraction of samples that share one id. A stale embedding update hurts in proportion to how many
samples touch the same row, so such bounds carry an ``alpha * tau`` term (e.g. Lian et al., KDD
2022, Theorem 1, Eq. 6; alpha = 1 is plain asynchronous SGD's rate).
"""

from __future__ import annotations

import numpy as np

from recjax.config import Config
from recjax.train.data import open_data


def id_alpha(cfg: Config) -> dict:
    """The training split's alpha: over every field, the largest fraction of samples that
    contain one id (an id counts once per sample however often it occurs in it).

    Returns:
      ``{"id_alpha", "id_alpha_field" (the field of that id), "samples", "distinct_ids_max"
      (the most distinct ids of one field), "distinct_ids_per_field"}``.
    """
    data = open_data(cfg)
    counts: dict[int, dict[int, int]] = {}  # field -> id -> samples containing it
    n = 0
    for ch in data.train.chunks():
        keep = np.ones(len(ch.label), bool) if data.keep_train is None else data.keep_train(ch.row)
        ids = ch.ids[keep]
        mask = None if ch.mask is None else ch.mask[keep] > 0
        n += len(ids)
        for f in range(ids.shape[1]):
            col = ids[:, f, :]
            pairs = np.stack([np.repeat(np.arange(len(col)), col.shape[1]), col.ravel()], 1)
            if mask is not None:
                pairs = pairs[mask[:, f, :].ravel()]
            u, c = np.unique(np.unique(pairs, axis=0)[:, 1], return_counts=True)
            d = counts.setdefault(f, {})
            for i, k in zip(u.tolist(), c.tolist()):
                d[i] = d.get(i, 0) + k
    fields = data.train.spec.fields
    best, field = max(((max(d.values()) / n, f) for f, d in counts.items() if d),
                      default=(0.0, -1))
    per_field = [len(counts.get(f, {})) for f in range(len(fields))]
    return {"id_alpha": best, "id_alpha_field": fields[field].name if field >= 0 else None,
            "samples": n, "distinct_ids_max": max(per_field, default=0),
            "distinct_ids_per_field": per_field}
