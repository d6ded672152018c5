"""Converted datasets: Parquet files of validated examples, read with ``--data parquet:DIR``.

Text is validated once, by the text readers, and written by `recjax.data.convert` (``python
scripts/convert.py criteo:PATH --out DIR``) as ``DIR/part-NNNNN.parquet``, one file per input,
in row groups of ``--rows-per-group`` rows, and ``DIR/manifest.json``. A run reads row groups
(only the columns it needs) and yields the chunks the text reader gives for the same options:
same ids (hashed with any ``hash_buckets``, or raw), dense values, labels, masks, rows and
chunk sizes, so batches, shuffles, hold-out splits and caches are the same too.

Columns (one row per example; ``NAME`` is the field's or dense column's name):

* ``row`` (int64): the example's row in the text, the 0-based data line (inputs counted one
  after another; bad lines keep their numbers, as in the text readers' chunks);
* ``label`` (float32): 0 or 1;
* ``dense:NAME`` (float32): the dense value as the reader emits it (``log1p`` applied);
* ``crc:NAME`` (uint32; a list of them for a multi-hot field): a field of tokens, the
  ``crc32`` of each token; hashed ids are ``hash_keys(crc, salt, hash_buckets)``;
* ``raw:NAME`` (int64, or a list): the same tokens' raw ids without field bits; raw ids are
  ``add_field(raw, salt)``;
* ``id:NAME`` (int32): a field of exact ids (MovieLens users, Avazu's hour of day, Frappe's
  features), used as they are.

A multi-hot field keeps at most the converter's ``--multi-hot-len`` tokens per example, plus
one: a list that long marks an example that had more, so a run counts truncated examples as the
text reader does (how many were cut at conversion is in the manifest). A run may ask for up to
``--multi-hot-len`` ids (``multi_hot_len``), or for more when no example was cut. Its mask and
those of the one-hot fields follow from the lists' lengths, as the text readers fill them.

Every file's key-value metadata (key ``recjax.columnar``) and the manifest hold the layout: the
source kind, dense names, each field's name, table, pooling, form (``tokens`` with its salt, or
``exact`` with its vocabulary) and whether it is multi-hot, plus the conversion's options. The
manifest adds per file its input, size in bytes, rows, first row, row-group sizes and the text
reader's counters. Files are written with Parquet's page checksums (CRC-32 of every page),
verified on every read; opening checks each file's size, footer, row groups, columns and layout
against the manifest. So a damaged, cut or replaced file is named, with the row group and
column, instead of read.

A row group is addressable (`ParquetSource.groups`, `ParquetSource.read_group`), so a reader
position is (file, row group, offset): the unit of the per-process shards and resumable
positions to come.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import threading
from collections.abc import Iterator

import numpy as np

from recjax.batch import Chunk, concat_chunks, take
from recjax.concurrency import ordered_map
from recjax.data.base import DataError, ReadStats, even_chunk_sizes
from recjax.data.hashing import TAG_HASHED, add_field, hash_keys, unpack_raw
from recjax.features import RAW_VOCAB, FeatureSpec, FieldSpec

FORMAT, VERSION = "recjax.columnar", 1
MANIFEST = "manifest.json"
RECONVERT = ("Convert the text again into a new folder (python scripts/convert.py KIND:PATH "
             "--out DIR)")


def part_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


# ----------------------------------------------------------------------------- the layout


@dataclasses.dataclass(frozen=True)
class StoredField:
    """How one field is stored.

    Attributes:
      name, table, pooling: as in `FieldSpec`.
      form: ``"tokens"`` (crc and raw columns; the run picks hashed or raw ids) or ``"exact"``
        (an ``id:`` column of ids in ``[0, vocab_size)``).
      salt: the salt the reader hashed the field with (tokens).
      vocab_size: the exact vocabulary (exact).
      multi_hot: a list per example (the field's ``max_len`` is the run's ``multi_hot_len``).
    """

    name: str
    table: str
    pooling: str
    form: str
    salt: int = 0
    vocab_size: int = 0
    multi_hot: bool = False

    def columns(self, raw_ids: bool) -> list[str]:
        if self.form == "exact":
            return [f"id:{self.name}"]
        return [f"{'raw' if raw_ids else 'crc'}:{self.name}"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a converted dataset holds (stored as JSON in the manifest and every file).

    Attributes:
      kind: the text source kind (``criteo``, ``taobao``, ...).
      dense_names: dense columns, in batch order.
      fields: in batch order (axis F of ``ids``).
      multi_hot_len: tokens kept per multi-hot example at conversion (1 without such fields);
        how many examples had more is in the manifest (``truncated``).
    """

    kind: str
    dense_names: tuple[str, ...]
    fields: tuple[StoredField, ...]
    multi_hot_len: int

    def to_json(self) -> dict:
        return {"kind": self.kind, "dense_names": list(self.dense_names),
                "fields": [dataclasses.asdict(f) for f in self.fields],
                "multi_hot_len": self.multi_hot_len}

    @classmethod
    def from_json(cls, d: dict) -> Layout:
        return cls(kind=d["kind"], dense_names=tuple(d["dense_names"]),
                   fields=tuple(StoredField(**f) for f in d["fields"]),
                   multi_hot_len=int(d["multi_hot_len"]))

    def columns(self) -> list[str]:
        """Every column of a file, in file order."""
        cols = ["row", "label", *(f"dense:{n}" for n in self.dense_names)]
        for f in self.fields:
            cols += [f"crc:{f.name}", f"raw:{f.name}"] if f.form == "tokens" else [f"id:{f.name}"]
        return cols

    def spec(self, hash_buckets: int, raw_ids: bool, multi_hot_len: int) -> FeatureSpec:
        """The FeatureSpec the text reader of `kind` has with these options."""
        fields = []
        for f in self.fields:
            vocab = f.vocab_size if f.form == "exact" else (RAW_VOCAB if raw_ids else hash_buckets)
            fields.append(FieldSpec(f.name, vocab, max_len=multi_hot_len if f.multi_hot else 1,
                                    table=f.table, pooling=f.pooling))
        return FeatureSpec(dense_names=self.dense_names, fields=tuple(fields))


# ----------------------------------------------------------------------------- the reader


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """One row group: the unit a reader reads, and (later) shards and seeks by.

    Attributes:
      file: index into the manifest's files.
      index: the row group's index in its file.
      rows: its examples.
    """

    file: int
    index: int
    rows: int


class ParquetSource:
    """``parquet:DIR``: a converted dataset as a `DataSource` (the module docstring).

    Attributes:
      name, spec, stats: the `DataSource` protocol (``stats.rows`` and ``stats.truncated`` of
        the latest pass; lines skipped at conversion are in the manifest, not here).
      path: the directory.
      layout: what the files hold.
      manifest: the parsed manifest.json.
      groups: every row group, in read order.
      raw_hashed: with raw ids, tokens of the latest pass that had no exact form (as the text
        readers count them).
    """

    kind = "parquet"

    def __init__(self, path: str | os.PathLike, *, hash_buckets: int = 1 << 17,
                 raw_ids: bool = False, multi_hot_len: int = 20, name: str | None = None,
                 chunk_rows: int = 65536, workers: int = 1):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.path = str(path)
        self.name = name or f"parquet:{self.path}"
        self.manifest = read_manifest(self.path)
        self.layout = Layout.from_json(self.manifest["layout"])
        self.hash_buckets, self.raw_ids = hash_buckets, raw_ids
        self.chunk_rows = chunk_rows
        self.max_len = self._check_multi_hot_len(multi_hot_len)
        self.spec = self.layout.spec(hash_buckets, raw_ids, self.max_len)
        if not raw_ids:
            hash_keys(np.zeros(0, np.uint32), 0, hash_buckets)  # the same ValueError, at once
        for f in self.layout.fields:
            if raw_ids and f.form == "tokens":
                add_field(np.zeros(0, np.int64), f.salt)  # the same ValueError as raw_ids
        self.files = [os.path.join(self.path, f["name"]) for f in self.manifest["files"]]
        self.groups = [RowGroup(i, g, n) for i, f in enumerate(self.manifest["files"])
                       for g, n in enumerate(f["row_groups"])]
        self._columns = ["row", "label", *(f"dense:{n}" for n in self.layout.dense_names)]
        for f in self.layout.fields:
            self._columns += f.columns(raw_ids)
        self._open_files: dict[int, object] = {}
        # one reader at a time: a ParquetFile is not safe to read from several threads (the
        # host-async workers share this source), pyarrow raised "ReadRangeCache did not find
        # matching cache entry"
        self._lock = threading.Lock()
        # a pass decodes row groups ahead on this many threads, each with its own open files
        # (`concurrency.ordered_map`: the same chunks in the same order for any number)
        self.workers = workers
        self._local = threading.local()
        self._count_lock = threading.Lock()
        for i in range(len(self.files)):
            self._file(i)  # every footer checked before the first step
        self.stats = ReadStats()
        self.raw_hashed: collections.Counter = collections.Counter()
        self.rows_read = 0  # examples decoded from row groups (every column a run reads)
        self.row_ids_read = 0  # examples whose `row` column alone was read (`chunk_row_ids`)
        self._group_start = np.concatenate([[0], np.cumsum([g.rows for g in self.groups])])

    @property
    def num_rows(self) -> int:
        return int(self.manifest["rows"])

    def day_first_rows(self) -> list[int]:
        """The first ``row`` of each file: file i is day i (`recjax.data.days`)."""
        return [int(f["first_row"]) for f in self.manifest["files"]]

    def __getstate__(self) -> dict:  # open files stay behind; another process opens its own
        return {**self.__dict__, "_open_files": {}, "_last": (None,), "_lock": None,
                "_local": None, "_count_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _local=threading.local(),
                             _count_lock=threading.Lock())

    def _check_multi_hot_len(self, multi_hot_len: int) -> int:
        multi = [f.name for f in self.layout.fields if f.multi_hot]
        if not multi:
            return 1
        if multi_hot_len < 2:  # as the Taobao reader: with L = 1 the batch would have no mask
            raise ValueError(f"multi_hot_len must be >= 2 for {multi[0]}, got {multi_hot_len}")
        cut = {k: v for k, v in self.manifest["truncated"].items() if v}
        if multi_hot_len > self.layout.multi_hot_len and cut:
            cuts = ", ".join(f"{n} of {k}" for k, n in cut.items())
            raise DataError(self.path, None, multi[0], f"multi_hot_len {multi_hot_len} asks for "
                            f"more ids than were kept: the conversion kept "
                            f"{self.layout.multi_hot_len} per example and cut longer lists "
                            f"({cuts} examples)",
                            f"Use --data.multi_hot_len <= {self.layout.multi_hot_len}, or "
                            "convert again with a larger --multi-hot-len")
        return multi_hot_len

    def _error(self, i: int, problem: str) -> DataError:
        return DataError(self.files[i], None, None, problem, RECONVERT)

    def _file(self, i: int):
        """The open `pyarrow.parquet.ParquetFile` of file i, its footer checked (once)."""
        if i in self._open_files:
            return self._open_files[i]
        import pyarrow.parquet as pq

        rec, path = self.manifest["files"][i], self.files[i]
        if not os.path.isfile(path):
            raise self._error(i, "listed in manifest.json but missing")
        size = os.path.getsize(path)
        if size != rec["bytes"]:
            raise self._error(i, f"has {size} bytes, manifest.json records {rec['bytes']} "
                              "(cut short, or replaced after the conversion)")
        try:
            # memory-mapped: pages are read from the page cache without a copy (~8% faster)
            pf = pq.ParquetFile(path, page_checksum_verification=True, memory_map=True)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...: a bad footer
            raise self._error(i, f"is not a readable Parquet file ({_brief(e)})") from None
        md = pf.metadata
        groups = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        if groups != rec["row_groups"]:
            raise self._error(i, f"has row groups of {_few(groups)} rows, manifest.json "
                              f"records {_few(rec['row_groups'])}")
        meta = (md.metadata or {}).get(FORMAT.encode())
        try:
            stored = json.loads(meta)["layout"] if meta else None
        except (ValueError, KeyError, TypeError):
            stored = None
        if stored != self.manifest["layout"]:
            raise self._error(i, "was not written by the conversion manifest.json describes "
                              "(its layout metadata differs or is missing)")
        names = pf.schema_arrow.names
        if names != self.layout.columns():
            raise self._error(i, f"has columns {_few(names)}, expected "
                              f"{_few(self.layout.columns())}")
        self._open_files[i] = pf
        return pf

    def read_group(self, group: RowGroup, own: bool = False) -> Chunk:
        """The examples of one row group as the text reader's chunk of the same rows (`own`:
        through this thread's own open file, for the threads of a pass)."""
        table = self._read_own(group) if own else self._read(group)
        n = group.rows
        with self._count_lock:
            self.rows_read += n
        col = {name: table.column(name) for name in self._columns}
        label = _numpy(col["label"])
        row = _numpy(col["row"])
        dense = np.empty((n, len(self.layout.dense_names)), np.float32)
        for j, name in enumerate(self.layout.dense_names):
            dense[:, j] = _numpy(col[f"dense:{name}"])
        spec = self.spec
        shape, dtype = (n, spec.n_fields, spec.max_len), np.int64 if self.raw_ids else np.int32
        ids = np.zeros(shape, dtype) if spec.multi_hot else np.empty(shape, dtype)  # all written
        mask = None
        if spec.multi_hot:
            mask = np.zeros(ids.shape, np.float32)
            mask[:, [f.max_len == 1 for f in spec.fields], 0] = 1.0
        for k, f in enumerate(self.layout.fields):
            column = col[f.columns(self.raw_ids)[0]]
            if not f.multi_hot:
                self._ids(f, _numpy(column), ids[:, k, 0])
                continue
            values, lengths = _lists(column)
            with self._count_lock:
                self.stats.truncated[f.name] += int(np.count_nonzero(lengths > self.max_len))
            pos = np.arange(values.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            keep = pos < self.max_len
            rows = np.repeat(np.arange(n), lengths)[keep]
            out = np.empty(int(keep.sum()), ids.dtype)
            self._ids(f, values[keep], out)
            ids[rows, k, pos[keep]] = out
            mask[rows, k, pos[keep]] = 1.0
        return Chunk(dense=dense, ids=ids, mask=mask, label=label, row=row)

    def _ids(self, f: StoredField, values: np.ndarray, out: np.ndarray) -> None:
        """Write one field's ids for its stored values into `out`."""
        if f.form == "exact":
            out[...] = values
        elif not self.raw_ids:
            hash_keys(values, f.salt, self.hash_buckets, out=out)
        else:
            add_field(values, f.salt, out=out)
            n = int(np.count_nonzero(unpack_raw(values)[1] == TAG_HASHED))
            if n:
                with self._count_lock:
                    self.raw_hashed[f.name] += n

    def _read_own(self, group: RowGroup):
        """`_read` through this thread's own ParquetFile (opened as `_file` opens it, its
        footer checked there already); a failure is named by `_read`."""
        import pyarrow.parquet as pq

        self._file(group.file)  # checked once, under the pass's first read
        files = self._local.__dict__.setdefault("files", {})
        try:
            if group.file not in files:
                files[group.file] = pq.ParquetFile(self.files[group.file], memory_map=True,
                                                   page_checksum_verification=True)
            return files[group.file].read_row_group(group.index, columns=self._columns,
                                                    use_threads=False)
        except Exception:
            return self._read(group)  # names the damaged columns, or reads

    def _read(self, group: RowGroup, columns: list[str] | None = None):
        with self._lock:
            return self._read_locked(group, columns)

    def _read_locked(self, group: RowGroup, columns: list[str] | None):
        pf = self._file(group.file)
        try:
            return pf.read_row_group(group.index, columns=columns or self._columns,
                                     use_threads=False)
        except Exception as e:  # pyarrow's OSError for a failed page checksum, ArrowInvalid...
            bad = []
            for c in columns or self._columns:  # name the damaged ones (only after a failure)
                try:
                    pf.read_row_group(group.index, columns=[c], use_threads=False)
                except Exception:
                    bad.append(c)
            raise self._error(group.file, f"row group {group.index} cannot be read, column"
                              f"{'s' if len(bad) != 1 else ''} {_few(bad) if bad else '?'} "
                              f"damaged ({_brief(e)})") from None

    def chunks(self, start: int = 0) -> Iterator[Chunk]:
        """One pass in row order, in chunks of ``chunk_rows`` examples (as the text readers
        cut them, so a shuffle buffer sees the same chunks); from stream position `start` on
        when given (the row group holding it is read from its first row, the chunks are cut
        where a whole pass cuts them)."""
        self.stats = ReadStats()
        self.raw_hashed = collections.Counter()
        first = int(np.searchsorted(self._group_start, start, side="right")) - 1
        parts, n = [], start % self.chunk_rows
        todo = range(max(first, 0), len(self.groups))
        read = ((lambda g: self.read_group(self.groups[g], own=True)) if self.workers > 1
                else (lambda g: self.read_group(self.groups[g])))
        for g, chunk in zip(todo, ordered_map(read, todo, self.workers)):
            begin = max(start - int(self._group_start[g]), 0)
            while begin < chunk.size:  # fill the pending chunk, emit it when full
                m = min(self.chunk_rows - n, chunk.size - begin)
                parts.append(chunk if m == chunk.size else take(chunk, slice(begin, begin + m)))
                n += m
                begin += m
                if n == self.chunk_rows:
                    yield self._emit(parts)
                    parts, n = [], 0
        if parts:
            yield self._emit(parts)

    # ------------------------------------------------------------------ seeking (recjax.data.seek)

    def seekable(self) -> bool:
        return True

    def chunk_sizes(self) -> list[int]:
        return even_chunk_sizes(self.num_rows, self.chunk_rows)

    def chunk_row_ids(self, c: int) -> np.ndarray:
        """The ``row`` of chunk `c`'s examples: that column alone of its row groups."""
        lo, hi = c * self.chunk_rows, min((c + 1) * self.chunk_rows, self.num_rows)
        parts = []
        g = int(np.searchsorted(self._group_start, lo, side="right")) - 1
        while g < len(self.groups) and self._group_start[g] < hi:
            rows = _numpy(self._read(self.groups[g], ["row"]).column("row"))
            self.row_ids_read += rows.size
            s0 = int(self._group_start[g])
            parts.append(rows[max(lo - s0, 0):hi - s0])
            g += 1
        return np.concatenate(parts)

    def take_rows(self, positions: np.ndarray) -> Chunk:
        """The examples at these stream positions, in this order (each row group read once)."""
        from recjax.data.seek import gather

        def read(g: int) -> Chunk:  # the last group is kept: a block after block reads it once
            last = getattr(self, "_last", (None,))  # one read: safe when threads share it
            if last[0] != g:
                last = self._last = (g, self.read_group(self.groups[g]))
            return last[1]

        return gather([g.rows for g in self.groups], read, positions)

    def _emit(self, parts: list[Chunk]) -> Chunk:
        chunk = concat_chunks(parts)
        self.stats.rows += chunk.size
        return chunk


def _numpy(column) -> np.ndarray:
    """A column of one row group as a numpy array (zero-copy when it is one chunk)."""
    if column.num_chunks == 1:
        return column.chunk(0).to_numpy()
    return column.combine_chunks().to_numpy()


def _lists(column) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, i64 lengths) of a list column."""
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return arr.flatten().to_numpy(), arr.value_lengths().to_numpy().astype(np.int64)


def _brief(e: Exception, limit: int = 200) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _few(items: list, keep: int = 5) -> str:
    shown = ", ".join(str(x) for x in items[:keep])
    return f"[{shown}{f', ... ({len(items) - keep} more)' if len(items) > keep else ''}]"


# ----------------------------------------------------------------------------- the manifest


def read_manifest(path: str) -> dict:
    """The parsed ``DIR/manifest.json`` of a converted dataset, its form checked.

    Raises:
      DataError: not a directory, no manifest, or a manifest that is not one of this format.
    """
    if not os.path.isdir(path):
        what = "a file" if os.path.exists(path) else "missing"
        raise DataError(path, None, None, f"not a converted dataset's folder ({what})",
                        "parquet:DIR takes the folder that python scripts/convert.py wrote")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise DataError(path, None, None, f"not a converted dataset: no {MANIFEST} (an "
                        "interrupted conversion leaves none)", RECONVERT)
    try:
        with open(mpath) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(mpath, None, None, f"cannot be read ({_brief(e)})", RECONVERT) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataError(mpath, None, None, f"not a {FORMAT} manifest", RECONVERT)
    if m.get("version") != VERSION:
        raise DataError(mpath, None, None, f"format version {m.get('version')!r}, this recjax "
                        f"reads version {VERSION}", RECONVERT)
    try:
        Layout.from_json(m["layout"])
        files = m["files"]
        ok = isinstance(m["rows"], int) and isinstance(files, list) and files and all(
            isinstance(f["name"], str) and isinstance(f["bytes"], int)
            and isinstance(f["row_groups"], list) for f in files)
        ok = ok and m["rows"] == sum(sum(f["row_groups"]) for f in files)
        ok = ok and isinstance(m["truncated"], dict)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(mpath, None, None, "malformed (edited, or not written by this version)",
                        RECONVERT)
    return m
