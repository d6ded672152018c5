"""One's own numpy arrays as a data source: ``ArraySource`` and the ``arrays:NAME`` kind.

    src = ArraySource(label=y, dense=x, ids=c)      # y f32[N] in {0,1}, x f32[N, D], c int[N, F]
    spec = register(src)                            # "arrays:NAME", usable as --data / data.train

The arrays are checked once, here (labels in {0, 1}, finite dense values, ids in
``[0, vocab_size)`` of their field), with the row and field of the first bad value, so a mistake
is reported before any training step. ``recjax.fit(cfg, train=src)`` registers sources itself.

The registry lives in this process: an ``arrays:`` spec means nothing to another process (a
``--backend ray`` actor or a second ``scripts/train.py``), which is told so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from recjax.batch import Chunk
from recjax.data.base import DataError, ReadStats, count_rows, even_chunk_sizes
from recjax.features import FeatureSpec, FieldSpec


class ArraySource:
    """A `DataSource` over arrays held in memory (DESIGN.md section 3's batch layout).

    Attributes:
      name: ``arrays:NAME`` once registered (``arrays`` before), for logs and summary.json.
      spec: dense columns ``dense_names``, one field per column of ``ids`` with its vocab size.
      stats: rows of the latest pass (arrays have no bad lines to skip).
    """

    kind = "arrays"

    def __init__(self, label: np.ndarray, dense: np.ndarray | None = None,
                 ids: np.ndarray | None = None, *, vocab_sizes: Sequence[int] | None = None,
                 mask: np.ndarray | None = None, field_names: Sequence[str] | None = None,
                 dense_names: Sequence[str] | None = None, name: str = "arrays",
                 chunk_rows: int = 65536):
        """Check and hold the arrays (no copy when they already have the right dtype).

        Args:
          label: [N] clicks, 0 or 1.
          dense: [N, D] numerical features, already transformed as the model should see them
            (e.g. ``log1p`` of counts); None = no dense features.
          ids: [N, F] categorical ids (one per field) or [N, F, L] (L ids per field, multi-hot);
            non-negative integers; None = no categorical fields.
          vocab_sizes: per field, the table size (every id of field f must be < vocab_sizes[f]);
            None = the largest id of each field + 1 (then an eval source must pass the train
            source's sizes, or the two schemas differ).
          mask: [N, F, L] 1 for a real id, 0 for padding (multi-hot only); None = every id real.
          field_names, dense_names: column names (default C1.., I1..), shown in summary.json.
          name: shown in logs until the source is registered.
          chunk_rows: rows per chunk of a pass.

        Raises:
          DataError: a shape, dtype or value that training would choke on, with the row and
            field of the first offender and what to do.
        """
        self.name = name
        self.chunk_rows = int(chunk_rows)
        label = np.asarray(label)
        if label.ndim != 1 or label.shape[0] == 0:
            raise self._error(None, "label", f"expected a non-empty 1-D array [N], got shape "
                              f"{label.shape}", "Pass one label per example")
        n = label.shape[0]
        bad = np.flatnonzero((label != 0) & (label != 1))
        if bad.size:
            raise self._error(bad[0], "label", f"label {label[bad[0]].item()!r} is not 0 or 1 "
                              f"({bad.size} such rows)", "Binarise the labels (clicks are 0/1)")
        self.label = label.astype(np.float32, copy=False)

        dense = np.zeros((n, 0), np.float32) if dense is None else np.asarray(dense)
        if dense.ndim != 2 or dense.shape[0] != n:
            raise self._error(None, "dense", f"expected shape [N={n}, D], got {dense.shape}",
                              "Pass one row of dense features per label")
        if not np.issubdtype(dense.dtype, np.number):
            raise self._error(None, "dense", f"dtype {dense.dtype} is not numeric",
                              "Convert the dense features to float32")
        dense = dense.astype(np.float32, copy=False)
        rows, cols = np.nonzero(~np.isfinite(dense))
        if rows.size:
            raise self._error(rows[0], f"dense[{cols[0]}]", f"value {dense[rows[0], cols[0]].item()} is "
                              "not finite", "Impute missing values (e.g. 0) before training")
        self.dense = dense

        ids = np.zeros((n, 0, 1), np.int32) if ids is None else np.asarray(ids)
        if ids.ndim == 2:
            ids = ids[:, :, None]
        if ids.ndim != 3 or ids.shape[0] != n:
            raise self._error(None, "ids", f"expected shape [N={n}, F] or [N, F, L], got "
                              f"{ids.shape}", "Pass one row of categorical ids per label")
        if not np.issubdtype(ids.dtype, np.integer):
            raise self._error(None, "ids", f"dtype {ids.dtype} is not an integer type",
                              "Map categories to integer ids first (e.g. np.unique(..., "
                              "return_inverse=True))")
        n_fields, max_len = ids.shape[1], ids.shape[2]
        if mask is not None:
            mask = np.asarray(mask, np.float32)
            if mask.shape != ids.shape:
                raise self._error(None, "mask", f"shape {mask.shape} differs from ids' {ids.shape}",
                                  "Give one mask entry per id")
        elif max_len > 1:
            mask = np.ones(ids.shape, np.float32)
        names = list(field_names or [f"C{f + 1}" for f in range(n_fields)])
        if len(names) != n_fields:
            raise self._error(None, "field_names", f"{len(names)} names for {n_fields} fields",
                              "Give one name per column of ids")
        if vocab_sizes is None:
            vocab_sizes = [int(ids[:, f].max()) + 1 if n else 1 for f in range(n_fields)]
        vocab_sizes = [int(v) for v in vocab_sizes]
        if len(vocab_sizes) != n_fields:
            raise self._error(None, "vocab_sizes", f"{len(vocab_sizes)} sizes for {n_fields} "
                              "fields", "Give one vocabulary size per column of ids")
        for f, (fname, vocab) in enumerate(zip(names, vocab_sizes)):
            col = ids[:, f]
            out = np.flatnonzero(((col < 0) | (col >= vocab)).any(axis=1))
            if out.size:
                raise self._error(out[0], fname, f"id {col[out[0]].tolist()} outside [0, {vocab}) "
                                  f"({out.size} such rows)",
                                  "Raise vocab_sizes for this field or remap its ids")
        self.ids = ids.astype(np.int32, copy=False)
        self.mask = mask
        dnames = tuple(dense_names or (f"I{d + 1}" for d in range(dense.shape[1])))
        if len(dnames) != dense.shape[1]:
            raise self._error(None, "dense_names", f"{len(dnames)} names for {dense.shape[1]} "
                              "dense columns", "Give one name per dense column")
        self.spec = FeatureSpec(dense_names=dnames, fields=tuple(
            FieldSpec(nm, v, max_len=max_len) for nm, v in zip(names, vocab_sizes)))
        self.stats = ReadStats()

    @property
    def num_rows(self) -> int:
        return int(self.label.shape[0])

    def _error(self, row, field, problem, fix) -> DataError:
        # arrays have rows, not lines: "arrays:NAME: field 'X': row R: ..." (no file:line)
        return DataError(self.name, None, field,
                         problem if row is None else f"row {int(row)}: {problem}", fix)

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """The rows in order, in chunks of ``chunk_rows`` (views, not copies); from row `start`
        on when given (cut where a whole pass is cut)."""
        self.stats = ReadStats()
        for lo in range(start - start % self.chunk_rows, self.num_rows, self.chunk_rows):
            lo, end = max(lo, start), min(lo + self.chunk_rows, self.num_rows)
            self.stats.rows += end - lo
            self.rows_read += end - lo
            yield self._rows(slice(lo, end), np.arange(lo, end, dtype=np.int64))

    def _rows(self, index, row: np.ndarray) -> Chunk:
        return Chunk(self.dense[index], self.ids[index],
                     None if self.mask is None else self.mask[index], self.label[index], row)

    # ------------------------------------------------------------------ seeking (recjax.data.seek)
    rows_read = 0  # rows handed out (an instance attribute once counted)
    random_access = True  # in memory: a worker's share is read by position (recjax.data.seek)

    def seekable(self) -> bool:
        return True

    def chunk_sizes(self) -> list[int]:
        return even_chunk_sizes(self.num_rows, self.chunk_rows)

    def chunk_row_ids(self, c: int) -> np.ndarray:
        lo = c * self.chunk_rows
        return np.arange(lo, min(lo + self.chunk_rows, self.num_rows), dtype=np.int64)

    def take_rows(self, positions: np.ndarray) -> Chunk:
        positions = np.asarray(positions, np.int64)
        count_rows(self, positions.size)
        return self._rows(positions, positions.copy())

    def as_raw_ids(self) -> ArraySource:
        """The same source with i64 ids (dynamic-id stores, ``embed.store=lru``); ids are exact
        already, so only their dtype changes (as in the file readers' raw_ids mode)."""
        other = object.__new__(ArraySource)
        other.__dict__.update(self.__dict__, ids=self.ids.astype(np.int64), stats=ReadStats())
        return other


_REGISTERED: dict[str, ArraySource] = {}
_COUNTER = itertools.count()


def register(source: ArraySource, name: str | None = None) -> str:
    """Make `source` reachable as the data spec ``arrays:NAME`` in this process; returns the spec.

    Args:
      name: the NAME; default a fresh one (``arrays:0``, ``arrays:1``, ...).
    """
    if not isinstance(source, ArraySource):
        raise TypeError(f"register takes an ArraySource, got {type(source).__name__}")
    name = name or str(next(_COUNTER))
    source.name = f"arrays:{name}"
    _REGISTERED[name] = source
    return source.name


def in_memory(spec: str) -> bool:
    """Whether the data spec `spec` names an in-memory source (this process's only)."""
    return spec.startswith("arrays:")


def unregister(spec: str) -> None:
    """Forget ``arrays:NAME`` (the arrays are freed once nothing else holds them)."""
    _REGISTERED.pop(spec.partition(":")[2], None)


def lookup(name: str, raw_ids: bool = False) -> ArraySource:
    """The source registered as ``arrays:NAME``.

    Raises:
      DataError: nothing of that name in this process.
    """
    if name not in _REGISTERED:
        known = ", ".join(f"arrays:{k}" for k in _REGISTERED) or "none"
        raise DataError(f"arrays:{name}", None, None,
                        f"no in-memory source of that name in this process (registered: {known})",
                        "In-memory sources exist only in the process that made them: call "
                        "recjax.fit(cfg, train=ArraySource(...)) from Python, or save the arrays "
                        "to a file and use a file source (e.g. criteo:PATH)")
    source = _REGISTERED[name]
    return source.as_raw_ids() if raw_ids else source
