"""``--data KIND:PATH`` -> a `DataSource`.

Kinds live in the `SOURCES` registry, so a module can add its own without touching this one::

    from recjax.data.sources import SOURCES
    SOURCES["synthetic"] = lambda arg, name, options: SyntheticSource(arg or "default", ...)

A factory is called as ``factory(arg, name, options)`` with ``arg`` the text after the first
``:`` (``""`` when there is none, e.g. ``synthetic``), ``name`` the whole spec (for logs and
summary.json) and ``options`` a `SourceOptions`. File-based kinds resolve ``arg`` with
`resolve_path`: a relative path that does not exist from the working directory is also tried
under ``$RECJAX_DATA``, so ``--data criteo:criteo_kaggle_8k/train.tsv`` works from anywhere once
``RECJAX_DATA`` points at the data folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from recjax.data import arrays
from recjax.data.avazu import AvazuSource
from recjax.data.base import DataError, DataSource
from recjax.data.columnar import ParquetSource
from recjax.data.criteo import CriteoCSVSource, CriteoSource
from recjax.data.libfm import FrappeSource
from recjax.data.movielens import MovieLensSource
from recjax.data.synthetic_seq import PositionsSource, SeqTeacherConfig, SeqTeacherSource
from recjax.data.taobao import TaobaoSource


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Reader options shared by all kinds (a kind ignores those it has no use for).

    Attributes:
      hash_buckets: buckets per hashed categorical field.
      skip_bad_lines: skip (and count) malformed lines instead of raising `DataError`.
      chunk_rows: lines parsed per block (the size of the chunks a source yields).
      multi_hot_len: ids kept per multi-hot field (L of ``ids[B, F, L]``).
      raw_ids: i64 ids; hashed fields get raw 64-bit (field, value) ids instead of buckets
        (`recjax.data.hashing.raw_ids`), for dynamic-id embedding stores; every kind takes it.
    """

    hash_buckets: int = 1 << 17
    skip_bad_lines: bool = False
    chunk_rows: int = 65536
    multi_hot_len: int = 20
    raw_ids: bool = False


# Where relative data paths are also looked up when $RECJAX_DATA is unset: the shared data folder
# next to a development checkout (../shared/data from the repository root).
DEFAULT_DATA = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                             "data"))

SourceFactory = Callable[[str, str, SourceOptions], DataSource]


def resolve_path(path: str) -> str:
    """`path` if it exists, else ``$RECJAX_DATA/path`` for a relative path that exists there.

    Without $RECJAX_DATA, `DEFAULT_DATA` (../shared/data next to the checkout) is tried instead.

    Raises:
      DataError: neither exists; the message names both places that were tried.
    """
    if os.path.exists(path):
        return path
    root = os.environ.get("RECJAX_DATA") or (DEFAULT_DATA if os.path.isdir(DEFAULT_DATA) else None)
    tried = [os.path.abspath(path)]
    if root and not os.path.isabs(path):
        candidate = os.path.join(root, path)
        if os.path.exists(candidate):
            return candidate
        tried.append(os.path.abspath(candidate))
    if os.environ.get("RECJAX_DATA"):
        hint = ""
    else:
        hint = ("; relative paths are also looked up under $RECJAX_DATA, which is not set"
                + (f" (so {DEFAULT_DATA} was tried)" if root else ""))
    raise DataError(path, None, None, f"no such file (tried {', '.join(tried)})",
                    f"Check the path{hint}")


def _file_kind(make: Callable[..., DataSource], *options: str) -> SourceFactory:
    """A factory for a file reader that takes the named `SourceOptions` fields as keywords."""

    def factory(arg: str, name: str, opts: SourceOptions) -> DataSource:
        if not arg:
            raise ValueError(f"data spec {name!r} has no path; write KIND:PATH")
        return make(resolve_path(arg), name=name, skip_bad_lines=opts.skip_bad_lines,
                    chunk_rows=opts.chunk_rows, **{o: getattr(opts, o) for o in options})

    return factory


def _no_path(name: str):
    raise ValueError(f"data spec {name!r} has no path; write KIND:PATH")


SOURCES: dict[str, SourceFactory] = {
    "criteo": _file_kind(CriteoSource, "hash_buckets", "raw_ids"),
    "criteo-csv": _file_kind(CriteoCSVSource, "hash_buckets", "raw_ids"),
    "avazu": _file_kind(AvazuSource, "hash_buckets", "raw_ids"),
    "frappe": _file_kind(FrappeSource, "raw_ids"),
    "movielens": _file_kind(MovieLensSource, "raw_ids"),
    "taobao": _file_kind(TaobaoSource, "hash_buckets", "multi_hot_len", "raw_ids"),
    # a folder written by scripts/convert.py (recjax/data/columnar.py); its lines were checked
    # when it was converted, so skip_bad_lines has nothing to do there
    "parquet": lambda arg, name, opts: ParquetSource(
        resolve_path(arg) if arg else _no_path(name), name=name, chunk_rows=opts.chunk_rows,
        hash_buckets=opts.hash_buckets, raw_ids=opts.raw_ids, multi_hot_len=opts.multi_hot_len),
    # numpy arrays registered in this process (recjax/data/arrays.py; recjax.train does it)
    "arrays": lambda arg, name, opts: arrays.lookup(arg, raw_ids=opts.raw_ids),
    # behaviour sequences (recjax/data/synthetic_seq.py): another kind's multi-hot fields as
    # one-hot position fields (seq:KIND:PATH), and the teacher with a behaviour sequence
    "seq": lambda arg, name, opts: PositionsSource(
        open_source(arg, **dataclasses.asdict(opts)), name),
    "synthetic-seq": lambda arg, name, opts: SeqTeacherSource(SeqTeacherConfig.parse(arg), name),
}


def open_source(spec: str, *, hash_buckets: int = 1 << 17, skip_bad_lines: bool = False,
                chunk_rows: int = 65536, multi_hot_len: int = 20, raw_ids: bool = False
                ) -> DataSource:
    """Open ``KIND:PATH`` (or ``KIND`` / ``KIND:NAME`` for kinds without a file).

    Args:
      spec: e.g. ``criteo:/data/criteo/train.tsv``, ``frappe:frappe/frappe.train.libfm``,
        ``parquet:DIR`` (a folder written by ``scripts/convert.py``).
      hash_buckets, skip_bad_lines, chunk_rows, multi_hot_len, raw_ids: see `SourceOptions`.

    Raises:
      ValueError: unknown kind (the message lists the known ones).
      DataError: missing, empty or malformed file (header checks run here, before training).
    """
    kind, _, arg = spec.partition(":")
    if kind not in SOURCES:
        raise ValueError(f"unknown data kind {kind!r} in {spec!r}; known kinds: "
                         f"{', '.join(sorted(SOURCES))} (write KIND:PATH)")
    options = SourceOptions(hash_buckets=hash_buckets, skip_bad_lines=skip_bad_lines,
                            chunk_rows=chunk_rows, multi_hot_len=multi_hot_len, raw_ids=raw_ids)
    return SOURCES[kind](arg, spec, options)
