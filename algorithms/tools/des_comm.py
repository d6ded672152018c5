"""DES communication-saving ratios on Criteo-shaped batches (docs/des.md, paper Table 2):
the body of ``scripts/des_comm.py``.

    python scripts/des_comm.py [--shards 8] [--embed-dim 16] [--hidden 400] [--out docs/des_comm.json]

For each global batch B, the unique ids each of N data-parallel workers would pull (per table,
from its B/N slice) are counted on the real Criteo sample and on the synthetic "criteo" preset
(Zipf ids at Kaggle cardinalities); R = 1 - Q_DES / Q_mesh with the formulas of sharding/comm.py.
A third column assumes the paper's ~950 ids per example, all distinct within a worker's slice.
"""


import argparse
import json
import pathlib

import numpy as np

from recjax.data.sources import open_source, resolve_path
from recjax.data.synthetic import PRESETS, SyntheticSource
from sharding import comm

BATCHES = (512, 1024, 2048, 4096, 8192)
CRITEO = "criteo_kaggle_8k/train.tsv"  # under $RECJAX_DATA (default ../shared/data)


def first_rows(source, n: int) -> np.ndarray:
    """ids of the first `n` examples (fewer if the source is smaller)."""
    got, rows = [], 0
    for chunk in source.chunks():
        got.append(chunk.ids)
        rows += chunk.size
        if rows >= n:
            break
    return np.concatenate(got)[:n]


def ratios(ids: np.ndarray, b: int, n: int, d: int, h: int) -> dict:
    if len(ids) < b:
        return {}  # the 7,200-line sample has no batch of 8192
    unique = comm.unique_per_worker(ids[:b], n, [str(f) for f in range(ids.shape[1])])
    out = {m: comm.saving_ratio(m, b, unique, n, d, h) for m in ("lr", "fm", "dnn")}
    return out | {"unique_ids_per_example": sum(unique) / b}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--embed-dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=400, help="width of the first FC layer (DNN)")
    p.add_argument("--criteo", default=str(CRITEO))
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    real = first_rows(open_source(f"criteo:{resolve_path(a.criteo)}", hash_buckets=1 << 20),
                      max(BATCHES))
    synth = first_rows(SyntheticSource(PRESETS["criteo"]), max(BATCHES))
    rows = []
    for b in BATCHES:
        paper = [950 * b // a.shards] * a.shards  # ~950 ids per example, distinct per worker
        rows.append({"batch": b,
                     "criteo_sample": ratios(real, b, a.shards, a.embed_dim, a.hidden),
                     "synthetic_criteo": ratios(synth, b, a.shards, a.embed_dim, a.hidden),
                     "paper_shape_950_ids": {m: comm.saving_ratio(m, b, paper, a.shards, a.embed_dim,
                                                                  a.hidden) for m in ("lr", "fm", "dnn")}})
    cols = ("criteo_sample", "synthetic_criteo", "paper_shape_950_ids")
    print(f"N={a.shards} D={a.embed_dim} H1={a.hidden}; R = 1 - Q_DES/Q_mesh (lr / fm / dnn)")
    print("| B | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for r in rows:
        cells = [" / ".join(f"{r[c][m]:+.3f}" for m in ("lr", "fm", "dnn")) if r[c] else "n/a"
                 for c in cols]
        print(f"| {r['batch']} | " + " | ".join(cells) + " |")
    print("unique ids per example:", {r["batch"]: [round(r[c].get("unique_ids_per_example", 0), 1)
                                                    for c in cols[:2]] for r in rows})
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=2) + "\n")
    return 0
