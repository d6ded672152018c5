"""Run outputs: metrics.jsonl, optional TensorBoard events, summary.json (written atomically)."""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Callable
from typing import Any


def _clean(x: Any) -> Any:
    """JSON-safe: numpy scalars -> python, NaN/inf -> None (JSON has no NaN)."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON to a temp file in the same directory, then rename over `path`."""

    def write(f):
        json.dump(_clean(obj), f, indent=2, sort_keys=False)
        f.write("\n")

    _replace(path, write)


def read_summary(path: str) -> tuple[dict | None, str]:
    """``(summary, "")`` of a run's summary.json, or ``(None, why not)``: absent, not JSON (cut
    short, empty), not an object, or without the fields every summary has (``steps``, a
    ``config`` object). Sweeps and tables read summaries through this, so a damaged one is
    counted and named, never taken for a finished run."""
    if not os.path.isfile(path):
        return None, "no summary.json (unfinished or not a run)"
    try:
        with open(path) as f:
            s = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"summary.json is not valid JSON ({str(e).splitlines()[0]}): cut short?"
    if not isinstance(s, dict):
        return None, f"summary.json holds a {type(s).__name__}, not a run's summary object"
    if not isinstance(s.get("steps"), int) or not isinstance(s.get("config", {}), dict):
        return None, "summary.json lacks a run's fields (an integer 'steps', a 'config' object)"
    return s, ""


def drop_records_after(path: str, step: int) -> None:
    """Remove the records of steps after `step` from the JSON-lines file `path` (if any).

    A run resumed from the checkpoint at `step` replays the steps after it; the records the
    interrupted segment wrote for them would otherwise appear twice. Records without a step
    are kept; a line cut short by a kill is dropped. The file is rewritten through a temp file
    and a rename, so a crash meanwhile leaves either the old or the new file.
    """
    if not os.path.lexists(path):
        return
    with open_run_file(path, "r") as f:
        lines = f.read().splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        at = record.get("step") if isinstance(record, dict) else None
        if not isinstance(at, (int, float)) or at <= step:
            kept.append(line)
    if kept != lines:
        _replace(path, lambda f: f.write("".join(x + "\n" for x in kept)))


def _replace(path: str, write: Callable[[Any], Any]) -> None:
    """`write(f)` into a temp file beside `path`, then rename it over `path`.

    The temp file is created with mode 0666 minus the umask (0644 under umask 022), as `open()`
    would create `path`; ``tempfile.mkstemp`` would make it 0600, unreadable to the group.
    """
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".tmp-{os.path.basename(path)}-{os.getpid()}-{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the kernel applies umask
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _is_number(v: Any) -> bool:
    """A python or numpy (0-d) real number, not a bool."""
    if isinstance(v, bool) or str(getattr(v, "dtype", "")) == "bool":
        return False
    return isinstance(v, (int, float)) or (hasattr(v, "item") and getattr(v, "ndim", 1) == 0)


def flat_scalars(d: dict, prefix: str = "") -> dict:
    """The numeric leaves of a nested dict as ``{"a.b": x}`` (TensorBoard takes scalars only).

    Strings, booleans, None, lists and non-finite numbers are left out.
    """
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_scalars(v, key + "."))
        elif _is_number(v) and math.isfinite(float(v)):
            out[key] = v.item() if hasattr(v, "item") else v
    return out


_MODES = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
          "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND}


def open_run_file(path: str, mode: str):
    """`open(path, mode)` of a file in a run directory without following a symbolic link: a
    link planted at ``OUT/.lock`` or ``OUT/metrics.jsonl`` made a run truncate or append to the
    file it points to (issue 40 item 5).

    Raises:
      ValueError: `path` is a symbolic link (naming it and what to do).
    """
    try:
        fd = os.open(path, _MODES[mode] | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        if os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link; a run writes its files only as plain "
                             f"files (it would write to {os.path.realpath(path)}): remove the "
                             "link, or use another --out") from None
        raise e
    return os.fdopen(fd, mode)


class MetricsWriter:
    """Appends one JSON object per record to ``out/metrics.jsonl``; mirrors scalars to TensorBoard.

    With ``out=""`` it writes nothing (a run without --out).
    """

    def __init__(self, out: str, tensorboard: bool = False, append: bool = False):
        self._f = None
        self._tb = None
        if out:
            os.makedirs(out, exist_ok=True)
            self._f = open_run_file(os.path.join(out, "metrics.jsonl"), "a" if append else "w")
            if tensorboard:
                from tensorboardX import SummaryWriter  # optional dependency, only when asked

                self._tb = SummaryWriter(os.path.join(out, "tb"))

    def write(self, record: dict) -> None:
        if self._f is not None:
            self._f.write(json.dumps(_clean(record)) + "\n")
            self._f.flush()
        if self._tb is not None:
            step = int(record.get("step", 0))
            kind = record.get("kind", "train")
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step",) and math.isfinite(v):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
