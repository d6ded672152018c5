"""The holder's side of checkpoint parts (`recjax.checkpoint_parts`), run in the process that
holds the tables (a Ray shard actor): the part's integrity rows, its write into the staging
directory, and its read-back for the check of a save.
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from recjax.checkpoint import (
    _check_sums,
    _Damaged,
    _first_line,
    _orbax_quiet,
    array_specs,
    checksums,
    host_sums,
)
from recjax.train.contract import non_finite_leaves


def record(part_tree: dict) -> tuple[list[list], list[str]]:
    """``(integrity rows, names of non-finite leaves)`` of a holder's part tree."""
    rows = [[*spec, crc] for spec, crc in zip(array_specs(part_tree), checksums(part_tree))]
    return rows, non_finite_leaves(part_tree)


def write(directory: str, part_tree: dict) -> None:
    """Write a holder's part tree as a standard orbax item into `directory` (its staging
    directory, moved into the step by `PartHandler`)."""
    shutil.rmtree(directory, ignore_errors=True)  # a retry after the holder was restarted
    path = epath.Path(directory)
    handler = ocp.StandardCheckpointHandler()
    with _orbax_quiet():
        handler.save(path, args=ocp.args.StandardSave(part_tree))
        handler.finalize(path)
    handler.close()


def check(directory: str, like: dict, rows: list[list]) -> str | None:
    """Read the part item in `directory` back (shapes of `like`, onto the CPU): None if its
    sums match `rows`, else why."""
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                            like)
    handler = ocp.StandardCheckpointHandler()
    try:
        got = handler.restore(epath.Path(directory), args=ocp.args.StandardRestore(abstract))
        _check_sums(rows, got, "the part's ", "crc32", host_sums)
    except _Damaged as e:
        return str(e)
    except Exception as e:  # unreadable files
        return f"an array file of {epath.Path(directory).name} cannot be read: {_first_line(e)}"
    finally:
        handler.close()
    return None
