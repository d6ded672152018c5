"""Checkpoints of a multi-process run (``jax.distributed``): every process writes its own
shards, process 0 commits, and a restore reads each process's shards of any other layout.

    ckpt = ShardedCheckpointer(out + "/checkpoints", mesh)   in every process, same arguments
    ckpt.save(step, state, meta)      state: global jax.Arrays, the single-device TrainState tree
    state, meta = ckpt.restore(like)  like: that tree's shapes; placed by `layout` over `mesh`

What is saved is the single-device layout (`recjax.train.step.TrainState`: tables by name,
dense params, optimizer state, sparse slots, step), each array split over the run's devices by
one rule (`layout`: the leading axis over every device where it divides, else over one mesh
axis, else the second axis, else whole), not the algorithm's own layout. Tables and their
slots are stored with zero rows padding them to a multiple of the device count
(`padded_rows`): split by rows as they lie in training, so a save moves no rows between
processes; every reader reads the true rows back. So a checkpoint
restores onto any process count, mesh or algorithm: the target's processes read only the
blocks of their own devices under the target's `layout` (orbax's restore with the target's
shardings; no array goes through one host), and a single process (``--algo gba``, one device)
reads it with `recjax.checkpoint.Checkpointer`. The algorithm turns the restored arrays into
its own layout on its devices (`sharding.spmd`).

orbax does the multi-host work (Orbax's multi-host checkpointing: each process writes the
shards whose replica id is 0 on its devices into its own ``ocdbt.process_i`` files; the
primary process writes the metadata and renames the step into place once every process has
finished, behind barriers of the ``jax.distributed`` coordination service). Saves are
asynchronous: `save` returns once the arrays are copied off the devices, training goes on
while the files are written, and the next `save` (or `finish`) waits for that commit.

Kept from the single-process checkpoints (`recjax.checkpoint`, whose docstring has the
details): an integrity record committed with the arrays (`recjax.checksum.wsum32`, which does
not depend on the layout, summed once, where the blocks are: one all-reduce per array),
damaged steps skipped on restore with the next older tried, and SIGINT/SIGTERM held while a
step is started or committed. Unlike one process's, a save does not read its step back: when
it commits (checked when the next save starts or at `finish`) its metadata is checked (the
record names every array written, orbax's metadata lists them), and its bytes are checked
against the record where they are read, by every restore; the rotation keeps the step before
(``max_to_keep`` >= 2) to fall back to. What differs: the processes agree, by one collective,
on every verdict (a read that failed on one process fails the step on all), and process 0
alone renames, deletes and cleans up, the others waiting at a barrier.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from recjax import checkpoint
from recjax.checkpoint import Checkpointer, _Damaged, _orbax_quiet, _signals_held
from recjax.checksum import KIND, wsum32


def layout(shape: tuple[int, ...], mesh: Mesh) -> P:
    """The checkpoint layout of an array of `shape` on `mesh`: the leading axis split over
    every device where it divides (over the mesh's axes in order), else over the largest
    single axis that divides it, else the same for the second axis; scalars and what
    nothing divides stay whole (replicated: written once, read by every device)."""
    names = tuple(n for n in mesh.axis_names if mesh.shape[n] > 1)
    options = [names] + [(n,) for n in sorted(names, key=lambda n: -mesh.shape[n])]
    for dim in range(min(len(shape), 2)):
        for axes in options:
            size = int(np.prod([mesh.shape[n] for n in axes])) if axes else 1
            if size > 1 and shape[dim] % size == 0:
                spec = [None] * dim + [axes if len(axes) > 1 else axes[0]]
                return P(*spec)
    return P()


def padded_rows(shape: tuple[int, ...], mesh: Mesh) -> tuple[int, ...]:
    """The shape a table (or its optimizer slot) of `shape` is stored with on `mesh`: the
    leading axis (rows) padded with zero rows to a multiple of the device count, so that
    `layout` splits it by rows over every device. That is how a row-wise table lies in
    training (`sharding.embedding`: ceil(rows / devices) rows per device, the last block
    padded), so writing it moves no rows between devices or processes; a table whose rows do
    not divide would otherwise be split by columns and half of it moved at every save. The
    zero rows change no `wsum32`, and every reader reads the first ``shape[0]`` rows back
    (orbax's non-strict restore truncates)."""
    n = mesh.devices.size
    if not shape or n == 1 or shape[0] % n == 0:
        return tuple(shape)
    return (-(-shape[0] // n) * n, *shape[1:])


@jax.tree_util.register_pytree_node_class
class Stored:
    """The state as a multi-process checkpoint stores it (`CheckpointLayout.logical`): the
    single-device layout's arrays, global, each table and slot padded by `padded_rows`, and
    the true shapes. A pytree of those arrays (``jax.tree.leaves`` sees the stored arrays);
    ``.step`` is the state's step.

    Attributes:
      arrays: the stored arrays (a `TrainState`), split over the devices by `layout`.
      shapes: every leaf's true shape, in leaf order.
    """

    def __init__(self, arrays: Any, shapes: tuple[tuple[int, ...], ...]):
        self.arrays, self.shapes = arrays, tuple(tuple(s) for s in shapes)

    @property
    def step(self):
        return self.arrays.step

    def like(self) -> Any:
        """The true shapes and dtypes (what a restore asks for, what the record names)."""
        leaves, tree = jax.tree.flatten(self.arrays)
        return tree.unflatten([jax.ShapeDtypeStruct(s, x.dtype)
                               for x, s in zip(leaves, self.shapes)])

    def unpadded(self) -> Any:
        """The arrays at their true shapes (the pad rows sliced off: rows move; tests)."""
        leaves, tree = jax.tree.flatten(self.arrays)
        return tree.unflatten([x if x.shape == s else x[: s[0]]
                               for x, s in zip(leaves, self.shapes)])

    def tree_flatten(self):
        return (self.arrays,), self.shapes

    @classmethod
    def tree_unflatten(cls, shapes, children):
        return cls(children[0], shapes)


def shardings(tree: Any, mesh: Mesh) -> Any:
    """`NamedSharding` by `layout` of every leaf (array or ShapeDtypeStruct) of `tree`."""
    return jax.tree.map(lambda x: NamedSharding(mesh, layout(tuple(x.shape), mesh)), tree)


def _shapes_of(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def array_names(state: Any, extra: Any = None) -> list[str]:
    """The record's names of the arrays of `state` (and `extra`), in order."""
    names = [r[0] for r in checkpoint.array_specs(state)]
    return names + ([r[0] for r in checkpoint.array_specs(extra)] if extra is not None else [])


def agree_any(flag: bool) -> bool:
    """Whether `flag` is true in any process (one collective; every process must call it)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.max(multihost_utils.process_allgather(np.int32(bool(flag)))))


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _fetch(tree: Any) -> Any:
    """Global arrays -> host numpy, whole (to check a single process's CRC-32s)."""
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True))
                        if isinstance(x, jax.Array) and not x.is_fully_addressable
                        else np.asarray(x), tree)


class ShardedCheckpointer(Checkpointer):
    """`Checkpointer` of a multi-process run: same directory layout and integrity record
    (checksum kind ``wsum32``), sharded and asynchronous writes. Every process builds one with
    the same arguments and calls every method at the same point of the run.

    Attributes:
      mesh: the run's mesh (restored arrays are placed by `layout` over it).
      sharded: True (the trainer saves the state's `logical` layout, global arrays).
    """

    sharded = True

    def __init__(self, directory: str, mesh: Mesh, max_to_keep: int = 2,
                 unverified: bool = False, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.unverified, self.max_to_keep, self.mesh = unverified, max_to_keep, mesh
        self.lead = jax.process_index() == 0
        self._mngr = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=None, create=True, enable_async_checkpointing=async_save))
        self._good: set[int] = set()
        self._bad: dict[int, str] = {}
        self._pending: tuple | None = None  # (step, array names) of the save in flight
        self.timings: dict[str, float] = {}  # seconds of the last save's parts (bench_pod)

    def clean_stale(self) -> None:
        """Process 0 removes unfinished saves; the others wait for it."""
        if self.lead:
            super().clean_stale()
        _barrier("recjax-ckpt-clean")
        self._mngr.reload()

    def save(self, step: int, state: Any, meta: dict, extra: Any = None) -> None:
        """Start writing `state` at `step` (global arrays in the single-device layout, or the
        `Stored` of `CheckpointLayout.logical`); returns once orbax holds a copy of the arrays.
        The save before it is waited for and checked first (`finish`), and only then are steps
        beyond `max_to_keep` removed. `timings` holds the seconds of this save's parts.

        Raises:
          OSError: orbax could not write a step; the older ones are left as they were.
        """
        with _signals_held(f"checkpoint step {step}"):
            t0 = time.perf_counter()
            self.finish()
            t1 = time.perf_counter()
            arrays, like = ((state.arrays, state.like()) if isinstance(state, Stored)
                            else (state, _shapes_of(state)))
            if step in self.all_steps():
                if step in self._good:
                    return
                why = self._bad.get(step) or self._verify(step, like, extra)
                if why is None:
                    self._good.add(step)
                    return
                if self.lead:
                    print(f"replacing damaged checkpoint step {step} in {self.directory} ({why})")
                self._delete(step)
            # summed once, on the devices where the blocks are (pad rows add 0): the record
            # every later read is checked against
            integrity = {"checksum": KIND, "arrays": [
                [*spec, s] for spec, s in zip(checkpoint.array_specs(like), wsum32(arrays))]}
            items = {"state": ocp.args.StandardSave(arrays)}
            if extra is not None:
                integrity["extra_arrays"] = [[*spec, s] for spec, s in
                                             zip(checkpoint.array_specs(extra), wsum32(extra))]
                items["extra"] = ocp.args.StandardSave(extra)
            t2 = time.perf_counter()
            try:
                with _orbax_quiet():
                    self._mngr.save(step, args=ocp.args.Composite(
                        **items, meta=ocp.args.JsonSave({**meta, "integrity": integrity})),
                        force=True)
            except Exception as e:
                self._failed(step, e)
            self._pending = (step, array_names(like, extra))
            self.timings |= {"finish_before": t1 - t0, "checksums": t2 - t1,
                             "orbax_save": time.perf_counter() - t2}

    def finish(self) -> None:
        """Wait for the save in flight to commit, check what was committed (`_check_commit`),
        then rotate. Its bytes are checked where they are read: a restore checks every
        array's wsum32 and falls back to the step before."""
        if self._pending is None:
            return
        step, names = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            with _orbax_quiet():
                self._mngr.wait_until_finished()
        except Exception as e:
            self._failed(step, e)
        self._mngr.reload()
        t1 = time.perf_counter()
        why = self._check_commit(step, names)
        self.timings |= {"commit_wait": t1 - t0, "commit_check": time.perf_counter() - t1}
        if agree_any(why is not None):
            why = why or "another process found it incomplete"
            self._bad[step] = why
            if self.lead:
                print(f"checkpoint step {step} in {self.directory} is damaged right after "
                      f"writing ({why}); it is ignored and the older checkpoints are kept")
            return
        self._good.add(step)
        self._rotate(step)

    def _check_commit(self, step: int, names: list[str]) -> str | None:
        """None if the committed `step` holds what was written, else why not: its metadata
        reads, with an integrity record naming exactly the arrays saved, and orbax's tree
        metadata of each item (``state``, ``extra``) lists as many arrays. Milliseconds: the
        bytes are not read again here; every restore checks them against the record (and
        falls back to the step before, kept by the rotation: ``max_to_keep`` >= 2)."""
        try:
            meta = self._meta(step)
            integrity = meta.get("integrity")
            record = checkpoint._integrity_record(integrity) or []
            extra = integrity.get("extra_arrays") or [] if isinstance(integrity, dict) else []
            if [r[0] for r in record + extra] != names:
                return "its integrity record does not name the arrays written"
            for item, rows in (("state", record), ("extra", extra)):
                if not rows:
                    continue
                path = os.path.join(self.directory, str(step), item, "_METADATA")
                with open(path) as f:
                    tree = json.load(f)["tree_metadata"]
                n = sum(v["value_metadata"]["value_type"] == "jax.Array" for v in tree.values())
                if n != len(rows):
                    return f"orbax's metadata of its {item} lists {n} arrays, not {len(rows)}"
        except _Damaged as e:
            return str(e)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"its array metadata cannot be read: {checkpoint._first_line(e)}"
        return None

    def close(self) -> None:
        with _signals_held("the last checkpoint"):
            self.finish()
        self._mngr.close()

    def _failed(self, step: int, e: Exception):
        """A save that orbax could not finish: drop its temp directory, say why (OSError)."""
        _barrier(f"recjax-ckpt-failed-{step}")
        if self.lead:
            for name in os.listdir(self.directory):
                if name.startswith(f"{step}{checkpoint.TMP_SUFFIX}"):
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        _barrier(f"recjax-ckpt-failed-{step}-done")
        self._mngr.reload()
        raise OSError(f"could not write checkpoint step {step} in {self.directory}: "
                      f"{checkpoint._first_line(e)}") from e

    # -- reading: every process its own blocks, the verdicts agreed --
    def _abstract(self, like: Any, host: bool = False) -> Any:
        del host  # read back where the run's layout puts it
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            like, shardings(like, self.mesh))

    def _restore_item(self, step: int, item: str, abstract: Any, strict: bool = True) -> Any:
        error, out = None, None
        try:
            out = super()._restore_item(step, item, abstract, strict)
        except Exception as e:  # this process's files; the others must learn of it
            error = e
        if agree_any(error is not None):
            raise error or _Damaged("another process could not read its part of the arrays")
        return out

    def _sums(self, kind: str, tree: Any) -> list[str]:
        return wsum32(tree) if kind == KIND else checkpoint.checksums(_fetch(tree))

    # -- deleting: process 0 renames and deletes, the others wait --
    def _delete(self, step: int) -> None:
        if self.lead:
            path = os.path.join(self.directory, str(step))
            trash = f"{path}{checkpoint.TMP_SUFFIX}-deleted"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
        _barrier(f"recjax-ckpt-delete-{step}")
        self._mngr.reload()
        self._good.discard(step)
        self._bad.pop(step, None)
