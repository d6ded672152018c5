"""What every data source provides, and the error type for bad input."""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterator
from typing import Protocol

from recjax.batch import Chunk
from recjax.features import FeatureSpec


class DataError(ValueError):
    """Bad input data, reported as ``file:line: field X: what is wrong. what to do``."""

    def __init__(self, path: str, line: int | None, field: str | None, problem: str, fix: str):
        where = f"{path}:{line}" if line is not None else str(path)
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}: {what}{problem}. {fix}")
        self.path, self.line, self.field, self.problem = path, line, field, problem


@dataclasses.dataclass
class ReadStats:
    """Counters a reader keeps while it streams; reported in summary.json.

    Attributes:
      rows: examples produced.
      skipped: lines skipped with ``--skip-bad-lines``, by reason (e.g. ``"field count"``).
      first_skipped: ``file:line`` of the first few skipped lines, so a user can look at them.
      first_lines: their line numbers (not in `as_dict`: for `all_skipped_error`).
      truncated: examples whose multi-hot field had more than ``max_len`` ids (the extra ids
        are dropped), by field name.
      unterminated: the number of the file's last line when it has no final newline (a file
        cut short ends that way, inside a field the parser may still accept).
    """

    rows: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first_skipped: list = dataclasses.field(default_factory=list)
    first_lines: list = dataclasses.field(default_factory=list)
    truncated: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unterminated: int | None = None

    def skip(self, err: DataError, keep: int = 5) -> None:
        self.skipped[err.problem.split(":")[0]] += 1
        if len(self.first_skipped) < keep:
            self.first_skipped.append(str(err))
            self.first_lines.append(err.line)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "skipped_lines": sum(self.skipped.values()),
                "skipped_by_reason": dict(self.skipped), "first_skipped": list(self.first_skipped),
                "truncated_by_field": dict(self.truncated),
                **({"last_line_unterminated": self.unterminated} if self.unterminated else {})}


def all_skipped_error(path: str, stats: ReadStats) -> DataError | None:
    """The error for a pass that skipped lines (``--skip-bad-lines``) and produced no example.

    Without it the run would stop later with "fewer than one batch; lower --batch-size", which
    hides that the file (or the source kind chosen for it) is wrong.
    """
    skipped = sum(stats.skipped.values())
    if stats.rows or not skipped:
        return None
    reasons = ", ".join(f"{r}: {n}" for r, n in stats.skipped.most_common())
    lines = ", ".join(str(n) for n in stats.first_lines if n is not None)
    first = stats.first_skipped[0] if stats.first_skipped else ""
    first = first if len(first) <= 200 else first[:197] + "..."
    return DataError(path, None, None,
                     f"every line was skipped as malformed ({skipped} lines; {reasons}); first "
                     f"at lines {lines}, e.g. {first.rsplit('. ', 1)[0]}",
                     "Check that the source kind (criteo:, avazu:, ...) matches the file's "
                     "format, or fix the file; --skip-bad-lines is for a few bad lines")


class DataSource(Protocol):
    """A finite, re-iterable stream of examples of one schema.

    Attributes:
      name: the spec the user gave (``criteo:PATH``), for logs and summary.json.
      spec: the schema of every chunk.
      stats: counters of the most recent pass.
    """

    name: str
    spec: FeatureSpec
    stats: ReadStats

    def chunks(self) -> Iterator[Chunk]:
        """One pass over the source in its own order; ``row`` counts examples from 0."""
        ...


_COUNT = threading.Lock()  # one for every source: a module's, so a source still pickles


def count_rows(source, n: int, field: str = "rows_read") -> None:
    """``source.rows_read += n`` (or `field`'s) for a source that threads read by position at
    once (the workers' supplies of one run share it): the bare ``+=`` loses counts when a
    thread switch falls between its read and its write (measured: 14,336 of 1,024,000 lost, 4
    threads on SyntheticSource.take_rows, whose sizes call sat between the two)."""
    with _COUNT:
        setattr(source, field, getattr(source, field) + n)


def even_chunk_sizes(rows: int, chunk_rows: int) -> list[int]:
    """A seekable source's ``chunk_sizes`` (`recjax.data.seek`) when its chunks are runs of
    `chunk_rows` examples and a shorter last one."""
    full, rest = divmod(rows, chunk_rows)
    return [chunk_rows] * full + ([rest] if rest else [])
