"""Optional PyTorch peers for scripts/bench.py: the same DLRM step in PyTorch, measured in-run.

PERF_NOTES lists PyTorch eager (``EmbeddingBag(sparse=True)``) and ``torch.compile`` among the
peers recjax must beat. They are measured here only if torch is installed (it is not a recjax
dependency: ``pip install torch`` to include them), on the same staged batches, interleaved
with the JAX variants.
"""

from __future__ import annotations

import numpy as np


def available() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # not installed, or a broken install: skip the peers, keep the bench
        return False
    return True


def make_runner(cards, n_dense: int, dim: int, bottom, top, lr: float, staged, compiled=False):
    """``(run(n), close)`` for `scripts.bench.interleaved`; `staged` holds recjax Batches."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(2)
    n_vec = len(cards) + 1
    li, lj = np.triu_indices(n_vec, k=1)
    li, lj = torch.as_tensor(li), torch.as_tensor(lj)

    def mlp(sizes, last_linear):
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if not (last_linear and i == len(sizes) - 2):
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.ModuleList()
            for c in cards:
                e = nn.EmbeddingBag(c, dim, mode="sum", sparse=True)
                nn.init.uniform_(e.weight, -1 / np.sqrt(c), 1 / np.sqrt(c))
                self.emb.append(e)
            self.bot = mlp([n_dense, *bottom, dim], last_linear=False)
            self.top = mlp([dim + n_vec * (n_vec - 1) // 2, *top, 1], last_linear=True)

        def forward(self, dense, ids):
            bo = self.bot(dense)
            t = torch.stack([bo] + [e(ids[:, f:f + 1]) for f, e in enumerate(self.emb)], dim=1)
            z = torch.bmm(t, t.transpose(1, 2))[:, li, lj]
            return self.top(torch.cat([bo, z], dim=1)).squeeze(1)

    model = DLRM()
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt_dense = torch.optim.SGD(dense_params, lr=lr)
    opt_sparse = torch.optim.SGD(model.emb.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    forward = torch.compile(model) if compiled else model
    data = [(torch.from_numpy(np.asarray(b.dense)), torch.from_numpy(np.asarray(b.ids)[:, :, 0]).long(),
             torch.from_numpy(np.asarray(b.label))) for b in staged]

    def run(n):
        for i in range(n):
            dense, ids, label = data[i % len(data)]
            opt_dense.zero_grad(set_to_none=True)
            opt_sparse.zero_grad(set_to_none=True)
            loss = loss_fn(forward(dense, ids), label)
            loss.backward()
            opt_dense.step()
            opt_sparse.step()

    return run, lambda: None
