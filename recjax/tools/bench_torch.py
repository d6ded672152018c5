"""Optional PyTorch peers for scripts/bench.py: the same DLRM step in PyTorch, measured in-run.

PERF_NOTES lists PyTorch eager (``EmbeddingBag(sparse=True)``) and ``torch.compile`` among the
peers recjax must beat. They are measured here only if torch is installed (it is not a recjax
dependency: ``pip install torch`` to include them), on the same staged batches, interleaved
with the JAX variants. ``device="cpu"`` (bench.py on the dev VMs) uses 2 threads; ``"cuda"``
(scripts/bench_gpu.py) moves the model and batches to the GPU, and ``run(n)`` synchronises the
device before it returns so that wall-clock timing counts the work.
"""

from __future__ import annotations

import os

import numpy as np

# torch's OpenMP threads spin-wait between calls by default. In a process that interleaves
# torch with XLA:CPU on 2 cores, the spinning threads took CPU from every variant: with active
# waiting, plain JAX ran 29K and torch.compile 35K ex/s; with passive waiting 34K and 40K
# (docs/performance.md). It must be set before torch (libgomp) is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # not installed, or a broken install: skip the peers, keep the bench
        return False
    return True


def make_runner(cards, n_dense: int, dim: int, bottom, top, lr: float, staged, compiled=False,
                device: str = "cpu"):
    """``(run(n), close)`` for `algorithms.tools.bench.interleaved`; `staged` holds recjax Batches."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    dev = torch.device(device)
    if dev.type == "cpu":
        torch.set_num_threads(2)
    n_vec = len(cards) + 1
    li, lj = np.triu_indices(n_vec, k=1)
    li, lj = torch.as_tensor(li, device=dev), torch.as_tensor(lj, device=dev)

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

    model = DLRM().to(dev)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt_dense = torch.optim.SGD(dense_params, lr=lr)
    opt_sparse = torch.optim.SGD(model.emb.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    forward = torch.compile(model, dynamic=False) if compiled else model
    data = [(torch.from_numpy(np.array(b.dense)).to(dev),
             torch.from_numpy(np.array(b.ids)[:, :, 0]).long().to(dev),
             torch.from_numpy(np.array(b.label)).to(dev)) for b in staged]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def run(n):
        for i in range(n):
            dense, ids, label = data[i % len(data)]
            opt_dense.zero_grad(set_to_none=True)
            opt_sparse.zero_grad(set_to_none=True)
            loss = loss_fn(forward(dense, ids), label)
            loss.backward()
            opt_dense.step()
            opt_sparse.step()
        sync()

    return run, lambda: None
