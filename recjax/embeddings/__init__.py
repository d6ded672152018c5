"""Embedding tables, lookups and sparse optimizers (the sparse half of every model)."""

from recjax.embeddings.sparse_optim import (
    SPARSE_OPTIMIZERS,
    SparseOptimConfig,
    SparseOptimizer,
    coalesce,
    make_sparse_optimizer,
)
from recjax.embeddings.tables import (
    EmbeddingLayout,
    TableConfig,
    init_rows,
    init_tables,
    lookup,
    make_layout,
    row_gradients,
)

__all__ = [
    "SPARSE_OPTIMIZERS", "EmbeddingLayout", "SparseOptimConfig", "SparseOptimizer", "TableConfig",
    "coalesce", "init_rows", "init_tables", "lookup", "make_layout", "make_sparse_optimizer", "row_gradients",
]
