"""Machinery shared by the line-oriented readers (Criteo, Avazu, libFM/Frappe, MovieLens, Taobao).

A reader streams its file in blocks of `PARSE_BLOCK` lines and yields chunks of up to
``chunk_rows`` examples. For each block it

1. splits every line on the delimiter and checks the field count;
2. converts column by column with vectorised code: a fast path validates a whole column at once
   (e.g. one ``translate`` over the joined tokens), and only when that fails does a slow per-token
   pass find which lines are bad. A reader with `TextSource.convert_block` (Criteo) first tries
   the whole block without a Python object per token: pyarrow's CSV parser splits it, and
   numpy checks and converts its columns; the first doubt (a field count, a lone CR, any value
   that is not plainly good) sends the block down the per-token path, which alone names bad
   lines, so messages and skipped lines are those of the per-token path;
3. reports the first bad line as ``DataError("file:line: field X: problem. what to do")``, or,
   with ``skip_bad_lines``, drops every bad line and counts it in ``stats``. A bad value never
   becomes a silent wrong value in a batch.

``Chunk.row`` is the 0-based index of the data line (header excluded). Skipped lines keep their
index (the next good line does not move up), so an example's hold-out side and worker do not
depend on whether bad lines elsewhere in the file were skipped.

The format modules (`criteo`, `avazu`, `libfm`, `movielens`, `taobao`) subclass `TextSource` and
implement `TextSource.convert`.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np

from recjax.batch import Chunk, concat_chunks
from recjax.data.base import DataError, ReadStats
from recjax.data.hashing import Tokens
from recjax.features import FeatureSpec

PARSE_BLOCK = 4096  # lines parsed at once (see TextSource.chunks)
SKIP_HINT = "Fix or remove the line, or pass --skip-bad-lines to skip such lines"
HOUR_VOCAB, WEEKDAY_VOCAB = 24, 7  # exact vocabularies of the time-derived fields

_SEPARATOR_NAMES = {b"\t": "tab", b",": "comma", None: "whitespace"}
_INT_CHARS = b"0123456789-"
_HEX_CHARS = b"0123456789abcdef"
_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes
_INT_RE = re.compile(rb"-?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark, written first by some Windows tools
_CR_FIX = "Convert the line endings first, e.g. `tr '\\r' '\\n' < FILE > FILE.unix`"
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"PK\x03\x04": "zip"}
_DECOMPRESS = {"gzip": "gunzip", "bzip2": "bunzip2", "xz": "unxz", "zip": "unzip"}


class Problems:
    """Bad lines of one block: position in the block -> (field, problem); the first one wins."""

    def __init__(self):
        self.rows: dict[int, tuple[str | None, str]] = {}

    def add(self, i: int, field: str | None, problem: str) -> None:
        self.rows.setdefault(int(i), (field, problem))

    def __bool__(self) -> bool:
        return bool(self.rows)


def show(token: bytes, limit: int = 40) -> str:
    """A token for an error message: its repr without the ``b``, shortened."""
    text = repr(token)[1:]
    return text if len(text) <= limit else text[: limit - 4] + "...'"


# ----------------------------------------------------------------------------- column converters
# Each takes one column (a sequence of raw byte tokens), records bad positions in `bad` with a
# problem written "reason: detail" (the reason is what ReadStats counts), and returns an array
# whose entries at bad positions are placeholders (those lines are dropped or raised).


def parse_label(tokens: Sequence[bytes], field: str, bad: Problems,
                values: dict[bytes, float]) -> np.ndarray:
    """f32[N] labels from an exact token -> value table (e.g. ``{b"0": 0, b"1": 1}``)."""
    out = np.fromiter(map(values.get, tokens, itertools.repeat(np.nan)), np.float32, len(tokens))
    for i in np.flatnonzero(np.isnan(out)):
        allowed = ", ".join(v.decode() for v in values)
        bad.add(i, field, f"bad label: got {show(tokens[i])}, expected one of {{{allowed}}}")
    return out


def parse_ints(tokens: Sequence[bytes], field: str, bad: Problems,
               allow_missing: bool = True) -> np.ndarray:
    """i64[N] from decimal integers ``-?[0-9]+``; an empty token is 0 when ``allow_missing``."""
    joined = b"".join(tokens)
    # int() alone would also take " 1", "+1" and "1_000": the character check keeps it strict.
    if not joined.translate(None, _INT_CHARS) and (allow_missing or b"" not in tokens):
        try:
            return np.fromiter([int(t) if t else 0 for t in tokens], np.int64, len(tokens))
        except (ValueError, OverflowError):
            pass  # e.g. "1-2" or a 20-digit number: find the culprits below
    out = np.zeros(len(tokens), np.int64)
    for i, t in enumerate(tokens):
        if not t:
            if not allow_missing:
                bad.add(i, field, "missing value: the field is empty, expected an integer")
        elif not _INT_RE.fullmatch(t):
            bad.add(i, field, f"not an integer: got {show(t)}")
        elif (v := _int64(t)) is None:
            bad.add(i, field, f"integer out of range: got {show(t)}, beyond 64 bits")
        else:
            out[i] = v
    return out


def _int64(t: bytes) -> int | None:
    """The value of a ``-?[0-9]+`` token if it fits int64, else None. Leading zeros are allowed,
    as on the fast path (``int()``); they are stripped first because int() refuses > 4300 digits."""
    digits = t.lstrip(b"-").lstrip(b"0") or b"0"
    if len(digits) > 19:
        return None
    v = -int(digits) if t.startswith(b"-") else int(digits)
    return v if _INT64_MIN <= v <= _INT64_MAX else None


_DECIMAL = re.compile(rb"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def parse_floats(tokens: Sequence[bytes], field: str, bad: Problems) -> np.ndarray:
    """f64[N] from decimal numbers (``-12``, ``3.9``, ``1e-3``); empty = 0 (missing); nan/inf,
    and what Python's float() takes beyond that (``1_000``, ``+3.9``, ``" 3.9"``, which the
    integer fields refuse), are rejected."""
    out = np.zeros(len(tokens), np.float64)
    for i, t in enumerate(tokens):
        if not t:
            continue
        if not _DECIMAL.fullmatch(t):
            try:
                odd = not np.isfinite(float(t))  # nan, inf: say so
            except ValueError:
                odd = False
            bad.add(i, field, f"not a finite number: got {show(t)}" if odd else
                    f"not a number: got {show(t)}, expected a decimal number such as 3.9 or -12 "
                    "(no spaces, signs '+' or digit separators)")
            continue
        try:
            out[i] = float(t)
        except ValueError:
            bad.add(i, field, f"not a number: got {show(t)}")
            continue
        if not np.isfinite(out[i]):
            bad.add(i, field, f"not a finite number: got {show(t)}")
            out[i] = 0.0
    return out


def check_hex(tokens: Sequence[bytes], field: str, bad: Problems) -> None:
    """Every token is lowercase hex digits (or empty = missing), as Criteo writes its hashes."""
    if not b"".join(tokens).translate(None, _HEX_CHARS):
        return
    for i, t in enumerate(tokens):
        if t.translate(None, _HEX_CHARS):
            bad.add(i, field, f"not a hex id: got {show(t)}, expected lowercase hex digits "
                              "(or nothing for a missing value)")


def check_text(tokens: Sequence[bytes], field: str, bad: Problems) -> None:
    """Every token is UTF-8 text without NUL bytes (either means a corrupt or binary file; a NUL
    would otherwise be hashed into a category of its own) and without leading or trailing
    whitespace (``"79 "`` would be hashed as a category apart from ``"79"``). Each check looks
    at the column's joined bytes first and at single tokens only when those hold a suspect."""
    joined = b"".join(tokens)
    if joined.translate(None, _WHITESPACE) != joined:  # a space somewhere: which token's edge?
        for i, t in enumerate(tokens):
            if t != t.strip():
                bad.add(i, field, f"whitespace around a category: got {show(t)}; categories "
                                  "are compared byte for byte, so it would be a category of "
                                  "its own: remove the spaces")
    if b"\x00" not in joined:
        try:
            joined.decode("utf-8")
            return
        except UnicodeDecodeError:
            pass
    for i, t in enumerate(tokens):
        if b"\x00" in t:
            bad.add(i, field, f"NUL byte: got {show(t)}, expected text; NUL bytes mean a "
                              "corrupt or binary file")
            continue
        try:
            t.decode("utf-8")
        except UnicodeDecodeError:
            bad.add(i, field, f"not UTF-8 text: got {show(t)}")


def log1p_counts(values: np.ndarray) -> np.ndarray:
    """f32: ``log1p(max(x, 0))``, the usual transform of count features (DLRM's Criteo recipe).

    Negative counts (Criteo has some ``-1``, ``-2``) and missing values (parsed as 0) both map
    to 0, so no NaN or inf can reach a batch.
    """
    return np.log1p(np.maximum(values, 0)).astype(np.float32)


def hour_weekday(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hour of day 0..23, weekday 0=Monday..6) of Unix times in seconds, UTC."""
    days = np.floor_divide(seconds, 86400)
    hour = np.floor_divide(seconds, 3600) % 24
    return hour.astype(np.int32), ((days + 3) % 7).astype(np.int32)  # 1970-01-01 was a Thursday


def table_salt(spec: FeatureSpec, field: str) -> int:
    """Hash salt of a field: the index of the first field of its table.

    Fields that share a table must put the same token in the same row, so they share a salt.
    """
    table = spec.field(field).table
    return next(i for i, f in enumerate(spec.fields) if f.table == table)


# ----------------------------------------------------------------------------- whole blocks
# The vectorised path of `TextSource.convert_block`: each returns None at the first doubt, and
# the block is then parsed token by token (which finds, names or skips the bad lines).

_IS_INT_CHAR = np.zeros(256, bool)
_IS_INT_CHAR[np.frombuffer(_INT_CHARS, np.uint8)] = True
_IS_HEX_CHAR = np.zeros(256, bool)
_IS_HEX_CHAR[np.frombuffer(_HEX_CHARS, np.uint8)] = True


def split_block(lines: list[bytes], n_cols: int, delimiter: bytes) -> list | None:
    """The block's columns as pyarrow binary arrays (one per column, no Python object per token),
    split by pyarrow's CSV parser with quoting off; None unless every line has exactly `n_cols`
    fields (an empty line has one) and the only CRs end lines."""
    if list(map(bytes.count, lines, itertools.repeat(delimiter))).count(n_cols - 1) != len(lines):
        return None
    data = b"".join(lines)
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return None  # pyarrow ends a line at a lone CR; the per-token path keeps it in a token
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = [f"c{j}" for j in range(n_cols)]
    try:
        table = pcsv.read_csv(
            pa.py_buffer(data),
            pcsv.ReadOptions(column_names=names, use_threads=False, block_size=len(data) + 1),
            pcsv.ParseOptions(delimiter=delimiter.decode(), quote_char=False, escape_char=False,
                              newlines_in_values=False, ignore_empty_lines=False),
            pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.binary()), null_values=[],
                                strings_can_be_null=False, check_utf8=False))
    except (pa.ArrowInvalid, ValueError):
        return None
    if table.num_rows != len(lines):
        return None
    return [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in table.columns]


def tokens_of(column) -> Tokens:
    """A pyarrow binary array as `Tokens` (its buffers, not copied)."""
    _, offsets, data = column.buffers()
    off = np.frombuffer(offsets, np.int32, len(column) + 1, column.offset * 4)
    raw = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
    return Tokens(raw, off)


def _chars_ok(tokens: Tokens, table: np.ndarray) -> bool:
    return bool(table[tokens.data[tokens.offsets[0]:tokens.offsets[-1]]].all())


def block_label(column, values: dict[bytes, float]) -> np.ndarray | None:
    """f32[N] labels if every token is a key of `values` (single bytes), else None."""
    if any(len(k) != 1 for k in values):
        return None
    tokens = tokens_of(column)
    if not (tokens.lengths == 1).all():
        return None
    table = np.full(256, np.nan, np.float32)
    for k, v in values.items():
        table[k[0]] = v
    out = table[tokens.data[tokens.offsets[:-1]]]
    return None if np.isnan(out).any() else out


def block_ints(column, allow_missing: bool = True) -> np.ndarray | None:
    """i64[N] of ``-?[0-9]+`` tokens (empty = 0 when `allow_missing`), as `parse_ints` reads
    them, else None: the characters are checked here, the digits parsed by pyarrow, which
    refuses ``-``, ``1-2`` and values beyond int64 as `parse_ints` does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tokens = tokens_of(column)
    if not _chars_ok(tokens, _IS_INT_CHAR):
        return None
    empty = tokens.lengths == 0
    if empty.any() and not allow_missing:
        return None
    valid = None if not empty.any() else pa.py_buffer(np.packbits(~empty, bitorder="little"))
    _, offsets, data = column.buffers()
    strings = pa.Array.from_buffers(pa.string(), len(column), [valid, offsets, data],
                                    offset=column.offset)
    try:
        ints = pc.cast(strings, pa.int64())
    except (pa.ArrowInvalid, ValueError):
        return None
    return ints.fill_null(0).to_numpy() if valid is not None else ints.to_numpy()


_IS_PLAIN_TEXT = np.zeros(256, bool)  # ASCII but NUL and `check_text`'s whitespace
_IS_PLAIN_TEXT[1:128] = True
_IS_PLAIN_TEXT[np.frombuffer(_WHITESPACE, np.uint8)] = False


def block_text(column) -> Tokens | None:
    """The column as `Tokens` if every byte is ASCII, not NUL and not whitespace (tokens that
    `check_text` passes without a look at each one), else None (`check_text` decides)."""
    tokens = tokens_of(column)
    return tokens if _chars_ok(tokens, _IS_PLAIN_TEXT) else None


def block_hex(column) -> Tokens | None:
    """The column as `Tokens` if every token is lowercase hex digits (or empty), else None."""
    tokens = tokens_of(column)
    return tokens if _chars_ok(tokens, _IS_HEX_CHAR) else None


# ----------------------------------------------------------------------------- the base reader


class TextSource:
    """A line-oriented file of examples; subclasses define the columns and `convert`.

    Class attributes:
      kind: the source kind in specs (``criteo``).
      delimiter: field separator, or None for any run of whitespace.
      columns: names of the fields of a line, in file order (the header when there is one).
      header: ``"none"``, ``"required"`` or ``"optional"`` (present iff the first token of
        the first line equals ``columns[0]``).

    Attributes:
      name, spec, stats: the `DataSource` protocol.
      path: the file.
    """

    kind: ClassVar[str] = ""
    delimiter: ClassVar[bytes | None] = b"\t"
    columns: tuple[str, ...] = ()  # a class attribute, or per instance (LibFMSource)
    header: ClassVar[str] = "none"

    def __init__(self, path: str | os.PathLike, *, spec: FeatureSpec, name: str | None = None,
                 skip_bad_lines: bool = False, chunk_rows: int = 65536):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.path = str(path)
        self.name = name or f"{self.kind}:{self.path}"
        self.spec = spec
        self.stats = ReadStats()
        self.skip_bad_lines = skip_bad_lines
        self.chunk_rows = chunk_rows
        self.has_header = self._check_start()

    # -- subclass hooks

    convert_block: ClassVar = None  # optional: (self, columns) -> arrays | None (see below)

    def convert(self, cols: list[Sequence[bytes]], bad: Problems
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        """Columns of well-formed lines -> (dense f32[N, n_dense], ids i32[N, F, L], mask, label).

        Record every bad value in `bad` (by position); the values there are then ignored.
        """
        raise NotImplementedError

    def check_header(self, tokens: list[bytes]) -> None:
        """Raise DataError unless the header names exactly `columns`, in order."""
        got = [t.decode("utf-8", "replace") for t in tokens]
        if got == list(self.columns):
            return
        missing = _few([c for c in self.columns if c not in got])
        extra = _few([c for c in got if c not in self.columns])
        detail = (f"missing {missing}" if missing else "") + (
            f"{'; ' if missing else ''}unexpected {extra}" if extra else "")
        raise DataError(self.path, 1, None,
                        f"bad header: {detail or 'columns in a different order'}",
                        f"The {self.kind} layout is {','.join(self.columns)}; "
                        "fix the header or pick the right source kind")

    # -- streaming

    def chunks(self) -> Iterator[Chunk]:
        """One pass over the file; resets `stats` when the pass starts."""
        self.stats = ReadStats()
        with open(self.path, "rb") as f:
            if f.read(len(_BOM)) != _BOM:
                f.seek(0)
            line = 0  # 1-based number of the last line read
            if self.has_header:
                f.readline()
                line = 1
            row = 0
            parts: list[Chunk] = []  # parsed blocks not yet yielded
            n_parts = 0
            # Parse in blocks of at most PARSE_BLOCK lines (their tokens stay in the CPU cache;
            # 64k-line blocks are ~1.6x slower) and yield chunks of up to `chunk_rows` rows.
            while lines := list(itertools.islice(f, min(PARSE_BLOCK, self.chunk_rows - n_parts))):
                part = self._parse_block(lines, line + 1, row)
                line += len(lines)
                row += len(lines)
                if not lines[-1].endswith(b"\n") and lines[-1].strip():
                    self.stats.unterminated = line  # the file's last line: it may be cut
                if part is not None:
                    parts.append(part)
                    n_parts += part.size
                if n_parts == self.chunk_rows:
                    yield self._emit(parts)
                    parts, n_parts = [], 0
            if parts:
                yield self._emit(parts)

    def _emit(self, parts: list[Chunk]) -> Chunk:
        chunk = concat_chunks(parts)
        self.stats.rows += chunk.size
        return chunk

    def _check_start(self) -> bool:
        """Fail early on a missing or empty file or a bad header; return whether there is one."""
        if not os.path.exists(self.path):
            raise DataError(self.path, None, None, "no such file",
                            "Check the path (relative paths are also looked up under "
                            "$RECJAX_DATA when you use --data KIND:PATH)")
        if not os.path.isfile(self.path):
            raise DataError(self.path, None, None, "not a regular file",
                            "Give the path of the data file itself, not of its folder")
        with open(self.path, "rb") as f:
            magic = f.read(6)
            f.seek(0)
            first, second = f.readline(), f.readline()
        for sig, fmt in _COMPRESSED.items():
            if magic.startswith(sig):
                raise DataError(self.path, None, None, f"the file is {fmt}-compressed",
                                f"Decompress it first (e.g. `{_DECOMPRESS[fmt]} {self.path}`)")
        if not first:
            raise DataError(self.path, None, None, "empty file: no lines at all",
                            "Check that the file was fully downloaded or extracted")
        first = first.removeprefix(_BOM)
        # UTF-16: its byte order mark, or (without one) a NUL beside every ASCII character; a
        # stray NUL in a field is that line's problem, not the file's
        if (magic.startswith((b"\xff\xfe", b"\xfe\xff"))
                or first.count(b"\x00") > 0.3 * len(first)):
            raise DataError(self.path, 1, None, "the file is UTF-16, not UTF-8 text",
                            "Convert it first, e.g. `iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8`")
        if b"\r" in first.rstrip(b"\r\n"):
            # Old Mac line endings: the whole file reads as one line, whose header or field-count
            # error would list every token of the file.
            raise DataError(self.path, 1, None, "the file uses CR-only line endings (\\r, old "
                            "Mac style), so it reads as one line", _CR_FIX)
        tokens = self._split(first)
        has_header = self.header == "required" or (
            self.header == "optional" and tokens[:1] == [self.columns[0].encode()])
        if has_header:
            self.check_header(tokens)
            if not second:
                raise DataError(self.path, 1, None, "no examples: the file has only a header",
                                "Check that the file was fully downloaded or extracted")
        return has_header

    def _split(self, line: bytes) -> list[bytes]:
        if self.delimiter is None:
            return line.split()
        return line.rstrip(b"\r\n").split(self.delimiter)

    def _parse_block(self, lines: list[bytes], first_line: int, first_row: int) -> Chunk | None:
        if self.convert_block is not None:
            # Whole block, vectorised: `convert_block(columns)` (pyarrow binary arrays from
            # `split_block`) returns convert's arrays, or None at its first doubt; it may have no
            # side effect before it is sure (ids are made last), as the block is then parsed
            # again below.
            columns = split_block(lines, len(self.columns), self.delimiter)
            arrays = None if columns is None else self.convert_block(columns)
            if arrays is not None:
                dense, ids, mask, label = arrays
                return Chunk(dense=dense, ids=ids, mask=mask, label=label,
                             row=np.arange(first_row, first_row + len(lines), dtype=np.int64))
        bad = Problems()
        cols, pos = self._columns(lines, bad)
        arrays = None
        if len(pos):
            sub = Problems()
            arrays = self.convert(cols, sub)
            for i, problem in sub.rows.items():
                bad.add(pos[i], *problem)
        if bad:
            ordered = sorted(bad.rows.items())
            errors = [DataError(self.path, first_line + i, field, problem, SKIP_HINT)
                      for i, (field, problem) in ordered[: 1 if not self.skip_bad_lines else None]]
            if not self.skip_bad_lines:
                raise errors[0]
            for err in errors:
                self.stats.skip(err)
            good = ~np.isin(pos, [i for i, _ in ordered])
            pos = pos[good]
            if arrays is not None:
                arrays = tuple(None if a is None else a[good] for a in arrays)
        if arrays is None or not len(pos):
            return None
        dense, ids, mask, label = arrays
        return Chunk(dense=dense, ids=ids, mask=mask, label=label,
                     row=(first_row + pos).astype(np.int64))

    def _columns(self, lines: list[bytes], bad: Problems
                 ) -> tuple[list[Sequence[bytes]], np.ndarray]:
        """(columns of the well-formed lines, their positions in the block); records the rest."""
        n_cols, sep = len(self.columns), self.delimiter
        if sep is not None and list(map(bytes.count, lines, itertools.repeat(sep))).count(
                n_cols - 1) == len(lines):
            # Fast path, every line has the right field count: split the whole block at once and
            # take columns by striding. No list per line, so no garbage-collector churn either.
            data = b"".join(lines)
            if not data.endswith(b"\n"):  # last line of a file without a final newline
                data += b"\n"
            flat = data.replace(b"\r\n", b"\n")[:-1].replace(b"\n", sep).split(sep)
            return [flat[j::n_cols] for j in range(n_cols)], np.arange(len(lines))
        rows = [self._split(ln) for ln in lines]
        lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        pos = np.flatnonzero(lengths == n_cols)
        for i in np.flatnonzero(lengths != n_cols):
            bad.add(i, *self._count_problem(int(lengths[i]), lines[i]))
        rows = [rows[i] for i in pos]
        return list(zip(*rows)), pos

    def _count_problem(self, got: int, line: bytes) -> tuple[str | None, str]:
        n = len(self.columns)
        sep = _SEPARATOR_NAMES.get(self.delimiter, repr(self.delimiter))
        if not line.strip():
            return None, f"field count: empty line, expected {n} {sep}-separated fields"
        if got < n:  # name the first field the line lacks
            return self.columns[got], f"field count: expected {n} {sep}-separated fields, got {got}"
        return self.columns[-1], (f"field count: expected {n} {sep}-separated fields, got {got} "
                                  f"(extra fields after {self.columns[-1]!r})")


def _few(names: list[str], keep: int = 5) -> str:
    """At most `keep` names for a message, then how many more (a broken header can have 10^5)."""
    shown = ", ".join(repr(n[:40]) for n in names[:keep])
    return f"[{shown}{f', ... ({len(names) - keep} more)' if len(names) > keep else ''}]"


def distinct_times(keys: np.ndarray, tokens: Sequence[bytes], field: str, bad: Problems,
                 to_datetime, expected: str) -> tuple[np.ndarray, np.ndarray]:
    """(hour of day, weekday) of time stamps, converted once per distinct key.

    Args:
      keys: one hashable key per line (the parsed value or the raw token).
      tokens: the raw tokens, for error messages.
      to_datetime: key -> ``datetime.datetime``; raises ValueError (or UnicodeDecodeError) for a
        bad value, which is recorded in `bad` for every line that has it.
      expected: what a good value looks like, for the message.
    """
    uniq, inverse = np.unique(np.asarray(keys, dtype=object), return_inverse=True)
    hour_u, weekday_u, ok_u = (np.zeros(len(uniq), dtype) for dtype in (np.int32, np.int32, bool))
    for u, key in enumerate(uniq):
        try:
            when = to_datetime(key)
        except (UnicodeDecodeError, ValueError):
            continue
        hour_u[u], weekday_u[u], ok_u[u] = when.hour, when.weekday(), True
    for i in np.flatnonzero(~ok_u[inverse]):
        bad.add(i, field, f"bad {field}: got {show(tokens[i])}, expected {expected}")
    return hour_u[inverse], weekday_u[inverse]
