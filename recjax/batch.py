"""The batch contract (DESIGN.md section 3) and helpers to build fixed-shape batches."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Batch(NamedTuple):
    """A fixed-shape batch of examples; a pytree, so it passes straight into jitted code.

    Attributes:
      dense: f32[B, n_dense] dense features after their transform (``log1p`` for counts).
      ids: i32[B, F, L] categorical ids, each in ``[0, vocab_size)`` of its field; padding
        positions hold 0 and are masked out.
      mask: f32[B, F, L] 1 for a real id, 0 for padding; ``None`` when every field is one-hot
        (L = 1), which keeps the common case free of a multiply.
      label: f32[B] click labels in {0, 1}.
    """

    dense: np.ndarray
    ids: np.ndarray
    mask: np.ndarray | None
    label: np.ndarray

    @property
    def size(self) -> int:
        return int(self.label.shape[0])


class Chunk(NamedTuple):
    """A variable-length run of parsed examples as a reader produces them.

    Same arrays as `Batch` with a leading axis N of any length, plus ``row``: the 0-based index
    of each example in its source (line order), used for seeded hold-out splits, for sharding a
    stream across workers, and in error messages.
    """

    dense: np.ndarray
    ids: np.ndarray
    mask: np.ndarray | None
    label: np.ndarray
    row: np.ndarray

    @property
    def size(self) -> int:
        return int(self.label.shape[0])


def concat_chunks(chunks: list[Chunk]) -> Chunk:
    """Concatenate chunks along the example axis (all from one source, so shapes agree)."""
    if len(chunks) == 1:
        return chunks[0]
    mask = None if chunks[0].mask is None else np.concatenate([c.mask for c in chunks])
    return Chunk(
        dense=np.concatenate([c.dense for c in chunks]),
        ids=np.concatenate([c.ids for c in chunks]),
        mask=mask,
        label=np.concatenate([c.label for c in chunks]),
        row=np.concatenate([c.row for c in chunks]),
    )


def take(chunk: Chunk, index: np.ndarray | slice) -> Chunk:
    """Rows `index` of a chunk (fancy index or slice)."""
    return Chunk(
        dense=chunk.dense[index],
        ids=chunk.ids[index],
        mask=None if chunk.mask is None else chunk.mask[index],
        label=chunk.label[index],
        row=chunk.row[index],
    )


def to_batch(chunk: Chunk, batch_size: int | None = None) -> tuple[Batch, int]:
    """Turn a chunk into a `Batch`, padding to `batch_size` rows if given.

    Returns:
      (batch, n_valid): padding rows have label 0, ids 0 and (if present) mask 0; callers that
      score a padded batch keep only the first ``n_valid`` predictions.
    """
    n = chunk.size
    if batch_size is None or n == batch_size:
        return Batch(chunk.dense, chunk.ids, chunk.mask, chunk.label), n
    if n > batch_size:
        raise ValueError(f"chunk of {n} rows does not fit a batch of {batch_size}")

    def pad(a):
        out = np.zeros((batch_size,) + a.shape[1:], a.dtype)
        out[:n] = a
        return out

    mask = None if chunk.mask is None else pad(chunk.mask)
    return Batch(pad(chunk.dense), pad(chunk.ids), mask, pad(chunk.label)), n
