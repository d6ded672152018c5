"""Checkpoints with orbax: the whole `TrainState` plus JSON metadata, checksummed, written
atomically, verified before anything older is dropped and again on restore.

orbax writes each step into a temporary directory and renames it into place only when complete
(its "commit"), so a crash mid-write never leaves a half checkpoint that `latest_step` would
pick up. Three things it does not do, done here:

* **Integrity.** The metadata of each step holds every array's path, shape, dtype and CRC-32
  (committed with the arrays in one rename). `restore` recomputes the CRCs; a step whose bytes
  were flipped, or whose array files are truncated, empty or gone, is skipped with a message
  and the next older one is tried. A checkpoint whose shapes differ from the run's is a
  mismatch (another model or data schema), never "damaged", and is not skipped.
* **Rotation.** Only after a new step has been read back and its CRCs match are steps beyond
  `max_to_keep` removed (renamed to a temporary name first, so a kill mid-delete never leaves a
  half step). The last good checkpoint therefore survives a save that went wrong.
* **Signals.** SIGINT and SIGTERM that arrive while a step is written are held (one line says
  so) and delivered once the save, its check and the rotation are done: a second Ctrl-C or a
  scheduler's SIGTERM never cuts a commit or a rotation in half.

Tables that other processes hold (the Ray backend's shard actors) can be written by them as
parts of the step, in the same commit and under the same checks (`recjax.checkpoint_parts`);
`restore` merges them back, so a reader never sees the difference.

The saved tree is plain arrays (dense params, optimizer state, tables, sparse slots, step), so a
checkpoint written by one algorithm can start another one with the same model (GBA's sync ->
async switch is such a hand-over).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import signal
import threading
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging

from recjax import checkpoint_parts
from recjax.checkpoint_parts import Loader, Part, array_specs
from recjax.checkpoint_quiet import orbax_quiet as _orbax_quiet
from recjax.checksum import KIND as wsum32_kind
from recjax.checksum import wsum32

# orbax logs every save through absl at WARNING/INFO; a progress bar is what users watch.
absl_logging.set_verbosity(absl_logging.ERROR)


TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's mark of a step directory not (or no longer) committed


class CheckpointCorruptError(OSError):
    """No intact checkpoint to restore: each one's arrays failed their checksums or could not
    be read. (An OSError: the files are at fault, not the run's config.)"""


class _Damaged(Exception):
    """One step's files are bad; the message says how."""


def _first_line(e: BaseException) -> str:
    """The first line of the innermost cause: tensorstore's words, not orbax's wrapping."""
    while e.__cause__ is not None:
        e = e.__cause__
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def checksums(tree: Any) -> list[str]:
    """CRC-32 (8 hex digits) of every array's bytes in `tree`, in leaf order."""
    return [f"{zlib.crc32(np.ascontiguousarray(x).reshape(-1).view(np.uint8)):08x}"
            for x in jax.tree.leaves(jax.device_get(tree))]


def host_sums(kind: str, tree: Any) -> list[str]:
    """The `kind` checksums of `tree`'s arrays held by this process: CRC-32 (what one process
    writes) or `recjax.checksum.wsum32` (what several processes write, checked the same way
    whatever the layout, so a run of one process resumes a multi-process run's checkpoint)."""
    return wsum32(tree) if kind == wsum32_kind else checksums(tree)


class Checkpointer:
    """Save/restore `TrainState`s under ``directory`` (e.g. ``runs/x/checkpoints``).

    Attributes:
      directory: absolute path of the checkpoint directory.
      max_to_keep: good checkpoints kept on disk (``train.keep_ckpts``).
    """

    def __init__(self, directory: str, max_to_keep: int = 2, unverified: bool = False):
        self.directory = os.path.abspath(directory)
        self.unverified = unverified  # restore steps without an integrity record (pre-checksum)
        self.max_to_keep = max_to_keep
        # Synchronous saves: the commit happens in the calling (main) thread, where signals are
        # held (`_signals_held`); rotation is ours, after verification (max_to_keep=None).
        self._mngr = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(
                max_to_keep=None, create=True, enable_async_checkpointing=False))
        self._good: set[int] = set()  # steps this process wrote or restored and verified
        self._bad: dict[int, str] = {}  # steps found damaged -> why

    def all_steps(self) -> list[int]:
        """Committed steps on disk, oldest first (damaged ones included)."""
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        """The newest committed step not known to be damaged."""
        return max((s for s in self.all_steps() if s not in self._bad), default=None)

    def clean_stale(self) -> None:
        """Remove the temporary directories of saves that never committed (a kill or crash
        mid-save, or mid-rotation). Call only while holding the run's lock: a save in progress
        has such a directory too."""
        stale = sorted(glob.glob(os.path.join(glob.escape(self.directory), f"*{TMP_SUFFIX}*")))
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        if stale:
            print(f"removed {len(stale)} unfinished checkpoint save(s) in {self.directory}: "
                  + ", ".join(os.path.basename(p) for p in stale))

    def save(self, step: int, state: Any, meta: dict, extra: Any = None,
             parts: Sequence[Part] = ()) -> None:
        """Write `state` at `step`, read it back and check it, then drop the oldest beyond
        `max_to_keep`; returns once all of that is done (a stop right after is safe).

        `extra`: a pytree of arrays that only the algorithm that wrote it reads back
        (`restore_extra`: e.g. ShadowSync's replicas), committed with `state` in the same
        rename and checksummed likewise; `restore` and every other algorithm ignore it.

        `parts`: tables that other processes hold and write themselves
        (`recjax.checkpoint_parts`), in the same rename; `state` then lacks those tables and
        their slots, and each holder reads its own part back for the check. `restore` merges
        them into the state it returns.

        A step that is already committed and intact is not written again (Ctrl-C right after a
        periodic save saves the same step); a damaged one is replaced. A step that fails its
        check right after writing is reported and ignored, and nothing older is removed.

        Raises:
          OSError: orbax could not write the step (e.g. a full disk); nothing older is touched.
        """
        with _signals_held(f"checkpoint step {step}"):
            if step in self.all_steps():
                if step in self._good:  # written (or restored) and verified by this process
                    return
                known = step in self._bad
                why = self._bad[step] if known else self._verify(step, state, parts=parts)
                if why is None:
                    self._good.add(step)
                    return
                print(f"replacing damaged checkpoint step {step} in {self.directory}"
                      + ("" if known else f" ({why})"))
                self._delete(step)
            record = [[*spec, crc] for spec, crc in zip(array_specs(state), checksums(state))]
            integrity = {"checksum": "crc32", "arrays": record}
            items = {"state": ocp.args.StandardSave(state)}
            if parts:  # written by their holders before orbax starts (`checkpoint_parts`)
                items.update({p.item: checkpoint_parts.PartSave(d) for p, d in zip(
                    parts, self._stage(step, parts))})
                integrity["parts"] = [{"item": p.item, "names": list(p.names),
                                       "arrays": p.record} for p in parts]
            if extra is not None:
                integrity["extra_arrays"] = [[*spec, crc] for spec, crc in
                                             zip(array_specs(extra), checksums(extra))]
                items["extra"] = ocp.args.StandardSave(extra)
            try:
                with _orbax_quiet():  # its threads log each failure with a traceback
                    self._mngr.save(step, args=ocp.args.Composite(
                        **items, meta=ocp.args.JsonSave({**meta, "integrity": integrity})),
                        force=True)
            except Exception as e:
                for path in glob.glob(os.path.join(glob.escape(self.directory),
                                                   f"{step}{TMP_SUFFIX}*")):
                    shutil.rmtree(path, ignore_errors=True)
                self._mngr.reload()
                why = _first_line(e)
                if "No space left on device" in str(e) or getattr(e, "errno", None) == 28:
                    last = self.latest_step()
                    why = ("the disk is full (No space left on device): free space or use an "
                           "--out on another disk; "
                           + (f"the checkpoint at step {last} is intact" if last is not None
                              else "no earlier checkpoint was written"))
                raise OSError(f"could not write checkpoint step {step} in {self.directory}: "
                              f"{why}") from e
            if parts:  # the staging directory, emptied into the step
                shutil.rmtree(os.path.join(self.directory, f"{step}{TMP_SUFFIX}-parts"),
                              ignore_errors=True)
            why = self._verify(step, state, extra, parts)
            if why is not None:
                self._bad[step] = why
                print(f"checkpoint step {step} in {self.directory} is damaged right after "
                      f"writing ({why}); it is ignored and the older checkpoints are kept")
                return
            self._good.add(step)
            self._rotate(step)

    def _stage(self, step: int, parts: Sequence[Part]) -> list[str]:
        """Have every holder write its part into the step's staging directory, all at once;
        their directories. A holder that fails: the staging directory is removed and the
        save fails (nothing of the step is written yet)."""
        staging = os.path.join(self.directory, f"{step}{TMP_SUFFIX}-parts")
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        dirs = [os.path.join(staging, p.item) for p in parts]
        errors = []
        waits = []
        for p, d in zip(parts, dirs):
            try:
                waits.append(p.write(d))
            except Exception as e:
                errors.append(e)
                break
        for wait in waits:  # every started write ends before the staging directory goes
            try:
                wait()
            except Exception as e:
                errors.append(e)
        if errors:
            shutil.rmtree(staging, ignore_errors=True)
            raise OSError(f"could not write checkpoint step {step} in {self.directory}: a "
                          f"part's holder failed: {_first_line(errors[0])}") from errors[0]
        return dirs

    def restore(self, like: Any, step: int | None = None,
                loader: Loader | None = None) -> tuple[Any, dict]:
        """Restore the state at `step` with the structure/shapes of `like`, checking its CRCs.

        Without `step`, the newest intact checkpoint: a damaged one is skipped with a message
        naming its step and why, and the one before it is tried.

        `loader`: holders that read the tables themselves (`recjax.checkpoint_parts.Loader`,
        every table of `like`); the state returned lacks them (its ``tables`` and ``slots``
        are empty). A step whose tables are in no per-table checksum this process can route
        (written before checksums, or by several processes) is read here whole instead.

        Raises:
          FileNotFoundError: no checkpoint in the directory.
          ValueError: the checkpoint's arrays do not match `like` (another model or data schema).
          CheckpointCorruptError: `step`, or (without `step`) every checkpoint, is damaged.
        """
        read = functools.partial(self._read, loader=loader)
        if step is not None:
            return self._or_corrupt(step, read, like)
        steps = self.all_steps()[::-1]
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}; nothing to resume "
                                    "(drop --resume to start a new run)")
        skipped = []
        for s in steps:
            try:
                return read(s, like)
            except _Damaged as e:
                self._bad[s] = str(e)
                skipped.append(f"step {s}: {e}")
                print(f"skipped damaged checkpoint step {s} in {self.directory} ({e})"
                      + ("; trying the one before" if s != steps[-1] else ""))
        raise CheckpointCorruptError(
            f"no intact checkpoint in {self.directory}: " + "; ".join(skipped)
            + ". Start a new run in another --out, or put back a copy of that directory")

    def restore_extra(self, step: int, like: Any) -> Any:
        """The `extra` tree saved with `step` (`save`), with the structure of `like`; None when
        the step has none (another algorithm wrote it, or a recjax version before extras).

        Raises:
          ValueError: its arrays do not match `like` (e.g. another number of replicas).
          CheckpointCorruptError: its bytes fail their checksums or cannot be read.
        """
        return self._or_corrupt(step, self._read_extra, like)

    def meta(self, step: int) -> dict:
        """The JSON metadata saved with `step` (its config, the run's progress).

        Raises:
          CheckpointCorruptError: it cannot be read.
        """
        return self._or_corrupt(step, lambda s, _: self._meta(s), None)

    def close(self) -> None:
        self._mngr.close()

    def _or_corrupt(self, step: int, read, like: Any) -> Any:
        """``read(step, like)``, a damaged step marked bad and raised as CheckpointCorruptError."""
        try:
            return read(step, like)
        except _Damaged as e:
            self._bad[step] = str(e)
            raise CheckpointCorruptError(
                f"checkpoint step {step} in {self.directory} is damaged: {e}") from None

    def _meta(self, step: int) -> dict:
        """The JSON metadata of `step`; `_Damaged` if it cannot be read."""
        try:
            return dict(self._mngr.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore())).meta)
        except Exception as e:
            raise _Damaged(f"its metadata cannot be read: {_first_line(e)}") from e

    @staticmethod
    def _abstract(like: Any, host: bool) -> Any:
        # onto this process's first device (the CPU with `host`), whatever layout wrote it: a
        # multi-process checkpoint's arrays are split over devices this process does not have
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        if host:
            with contextlib.suppress(RuntimeError):  # no CPU backend: the default device
                sharding = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        # a 64-bit leaf (an LRU store's raw ids, its clock) stays numpy: as a jax array
        # without x64 it would come back 32-bit, and its bytes would fail their CRC
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=sharding
            if jax.dtypes.canonicalize_dtype(x.dtype) == x.dtype else None), like)

    def _read_extra(self, step: int, like: Any, host: bool = False) -> Any:
        """The verified `extra` of `step` (None if it has none); `_Damaged` on bad bytes."""
        meta = self._meta(step)
        integrity = meta.get("integrity")
        record = integrity.get("extra_arrays") if isinstance(integrity, dict) else None
        if record is None:
            return None
        _integrity_record({"checksum": integrity.get("checksum"), "arrays": record})
        mine = array_specs(like)
        if [r[:3] for r in record] != mine:
            raise ValueError(f"checkpoint {self.directory}/{step}: the algorithm's own state "
                             f"does not fit this run: {_spec_diff([r[:3] for r in record], mine)}")
        try:
            extra = self._restore_item(step, "extra", self._abstract(like, host), strict=False)
        except Exception as e:
            raise _Damaged(f"an array file of its algorithm state cannot be read: "
                           f"{_first_line(e)}") from e
        _check_sums(record, extra, "the algorithm state's ", integrity.get("checksum"), self._sums)
        return extra

    def _read(self, step: int, like: Any, host: bool = False, read_parts: bool = True,
              loader: Loader | None = None) -> tuple[Any, dict]:
        """The verified ``(state, meta)`` of `step`, onto the CPU with `host`; its parts
        (`save`) read and merged in, or (not `read_parts`: their holders check them) left out;
        with `loader` (`restore`) every table left to it.

        Raises:
          ValueError: another model or data schema; _Damaged: unreadable or wrong bytes.
        """
        meta = self._meta(step)
        integrity = meta.get("integrity")
        kind = integrity.get("checksum") if isinstance(integrity, dict) else None
        record = _integrity_record(meta.pop("integrity", None))
        if record is None and not self.unverified:
            # every step this version writes has one: its absence is damage or tampering (a
            # deleted or nulled record switched the checks off: 6 of 30 bit flips restored)
            raise _Damaged("it has no integrity record (checksums), so its bytes cannot be "
                           "verified; a checkpoint of a recjax version before checksums resumes "
                           "with --train.unverified_resume=true")
        parts = _parts_record(integrity) if record is not None else []
        partial, sources = False, None
        if loader is not None and kind == "crc32":  # (wsum32: padded tables, read here)
            if set(loader.names) != set(like.tables):
                raise ValueError(f"a loader takes every table; {sorted(loader.names)} is not "
                                 f"{sorted(like.tables)}")
            try:
                like, record, partial, sources = checkpoint_parts.locate(
                    like, loader.names, record, parts, os.path.join(self.directory, str(step)))
            except KeyError as e:
                raise ValueError(self._mismatch(step, e.args[0])) from None
            parts = []  # the loader's
        full, subs = like, []
        for p in parts:  # the tables other processes wrote (`recjax.checkpoint_parts`)
            like, sub = checkpoint_parts.split(like, p["names"])
            subs.append(sub)
        if record is not None:
            mine = array_specs(like)
            if [r[:3] for r in record] != mine:
                raise ValueError(self._mismatch(step, _spec_diff([r[:3] for r in record], mine)))
            if read_parts:
                for p, sub in zip(parts, subs):
                    if [r[:3] for r in p["arrays"]] != array_specs(sub):
                        raise ValueError(self._mismatch(step, f"{p['item']}: " + _spec_diff(
                            [r[:3] for r in p["arrays"]], array_specs(sub))))
        try:
            state = (checkpoint_parts.read_rest(os.path.join(self.directory, str(step), "state"),
                                                self._abstract(like, host)) if partial else
                     self._restore_item(step, "state", self._abstract(like, host),
                                        strict=record is None))
            got = [self._restore_item(step, p["item"], self._abstract(sub, host))
                   for p, sub in zip(parts, subs)] if read_parts else []
        except Exception as e:
            if record is None:  # written before checksums: cannot tell mismatch from damage
                raise ValueError(self._mismatch(step, _first_line(e) + " (or the checkpoint "
                                                "is damaged)")) from e
            raise _Damaged(f"an array file cannot be read: {_first_line(e)}") from e
        if record is not None:
            _check_sums(record, state, kind=kind, sums=self._sums)
            for p, tree in zip(parts, got):
                _check_sums(p["arrays"], tree, f"{p['item']}: ", kind=kind, sums=self._sums)
        if parts and read_parts:
            state = checkpoint_parts.merge(state, got, full)
        if sources is not None and (why := loader.load(sources)) is not None:
            raise _Damaged(why)
        self._good.add(step)
        return state, meta

    def _verify(self, step: int, like: Any, extra: Any = None,
                parts: Sequence[Part] = ()) -> str | None:
        """None if `step` reads back (onto the CPU) with matching CRCs, else why not; each of
        `parts` is read back by its holder (`like` lacks their tables).

        Raises:
          ValueError: `step` holds another model's arrays (left alone: not damage).
        """
        try:
            self._read(step, like, host=True, read_parts=not parts)
            if extra is not None:
                self._read_extra(step, extra, host=True)
        except _Damaged as e:
            return str(e)
        if parts:
            saved = {p["item"]: p for p in _parts_record(self._meta(step)["integrity"])}
            for p in parts:
                if p.item not in saved or saved[p.item]["names"] != list(p.names):
                    return f"its record does not name the part {p.item}"
                why = p.verify(os.path.join(self.directory, str(step), p.item))
                if why is not None:
                    return f"{p.item}: {why}"
        return None

    def _restore_item(self, step: int, item: str, abstract: Any, strict: bool = True) -> Any:
        """The arrays of `item` ("state" or "extra") of `step`, shaped and placed as `abstract`.
        Not `strict`: an array stored with more rows is read to `abstract`'s (a multi-process
        checkpoint pads its tables, `recjax.checkpoint_sharded.padded_rows`); only where the
        integrity record has already matched `abstract`'s shapes, which the sums then check."""
        args = (checkpoint_parts.PartRestore if item.startswith(checkpoint_parts.PREFIX)
                else ocp.args.StandardRestore)
        return getattr(self._mngr.restore(step, args=ocp.args.Composite(
            **{item: args(abstract, strict=strict)})), item)

    def _sums(self, kind: str, tree: Any) -> list[str]:
        """Checksums of a restored tree (`host_sums`; the multi-process checkpointer sums
        global arrays where they are)."""
        return host_sums(kind, tree)

    def _mismatch(self, step: int, detail: str) -> str:
        return (f"checkpoint {self.directory}/{step} does not fit this run's model and data "
                f"(different --model, sizes or data schema?): {detail}")

    def _rotate(self, newest: int) -> None:
        """Keep `newest` (verified) and the ``max_to_keep - 1`` newest good steps before it;
        remove the other older ones, damaged ones included. Newer steps are left alone."""
        older = [s for s in self.all_steps()[::-1] if s < newest]
        keep = [s for s in older if s not in self._bad][: self.max_to_keep - 1]
        for s in older:
            if s not in keep:
                self._delete(s)

    def _delete(self, step: int) -> None:
        """Remove a step: rename it out of the step list first (atomic), then delete the files,
        so a kill in between leaves a temp directory `clean_stale` removes, not a half step."""
        path = os.path.join(self.directory, str(step))
        trash = f"{path}{TMP_SUFFIX}-deleted"
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        self._mngr.reload()
        self._good.discard(step)
        self._bad.pop(step, None)


CHECKSUMS = ("crc32", wsum32_kind)  # one process writes crc32; several, wsum32 (recjax.checksum)


def _integrity_record(integrity: Any) -> list[list] | None:
    """The ``[path, shape, dtype, sum]`` rows of a step's integrity metadata, None if it has
    none, and `_Damaged` if it is there but malformed (a tampered or damaged record)."""
    if integrity is None:
        return None
    record = integrity.get("arrays") if isinstance(integrity, dict) else None
    if (not isinstance(integrity, dict) or integrity.get("checksum") not in CHECKSUMS
            or not _rows(record)):
        raise _Damaged("its integrity record is malformed (damaged or edited)")
    return record


def _parts_record(integrity: dict) -> list[dict]:
    """The parts a step's integrity record lists (`save`), checked for form; [] if none."""
    parts = integrity.get("parts", [])
    if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("item"), str)
            and p["item"].startswith(checkpoint_parts.PREFIX)
            and isinstance(p.get("names"), list) and _rows(p.get("arrays")) for p in parts):
        raise _Damaged("its integrity record is malformed (damaged or edited)")
    return parts


def _rows(record: Any) -> bool:
    """`record` has the form of an integrity record's rows: ``[path, shape, dtype, sum]``."""
    return isinstance(record, list) and all(
        isinstance(r, list) and len(r) == 4 and isinstance(r[3], str) for r in record)


def _check_sums(record: list[list], tree: Any, what: str = "", kind: str = "crc32",
                sums=None) -> None:
    """`_Damaged` naming the arrays of `tree` whose checksum (`kind`) differs from the
    `record`'s; `sums(kind, tree)` computes them (default: on this host)."""
    got = (sums or host_sums)(kind, tree)
    bad = [r[0] for r, crc in zip(record, got) if r[3] != crc]
    if bad:
        raise _Damaged(f"checksum mismatch in {what}{bad[0]}"
                       + (f" and {len(bad) - 1} more arrays" if len(bad) > 1 else ""))


def _spec_diff(saved: list[list], mine: list[list]) -> str:
    """The first array whose path, shape or dtype differ, in words."""
    if len(saved) != len(mine):
        return f"the checkpoint holds {len(saved)} arrays, this run's state {len(mine)}"
    for a, b in zip(saved, mine):
        if a != b:
            return (f"{a[0]}: checkpoint {a[2]}{a[1]}"
                    + (f", this run {b[2]}{b[1]}" if a[0] == b[0] else f"; this run has {b[0]}"))
    return "?"


@contextlib.contextmanager
def _signals_held(what: str) -> Iterator[None]:
    """Hold SIGINT and SIGTERM while `what` is written; deliver the first one afterwards.

    Python raises KeyboardInterrupt wherever the main thread is, also inside orbax's commit or
    between a commit and the removal of an older step. Here a signal only sets a flag (and
    prints one line); the handler that was installed before runs once the block is done (for
    SIGINT, by default, KeyboardInterrupt; for SIGTERM, by default, the process ends). Outside
    the main thread no handler can be installed, and nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum, frame):
        if not got:
            os.write(2, f"{signal.Signals(signum).name} while writing {what}: stopping once it "
                        "is committed\n".encode())
        got.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
        if got:
            h = old[got[0]]
            if callable(h):
                h(got[0], None)
            elif h != signal.SIG_IGN:
                signal.raise_signal(got[0])
