"""Checkpoints with orbax: the whole `TrainState` plus JSON metadata, written atomically.

orbax writes each step into a temporary directory and renames it into place only when complete
(its "commit" step), so a crash mid-write never leaves a half checkpoint that `latest` would pick
up; `max_to_keep` removes old steps only after the new one is committed.

The saved tree is plain arrays (dense params, optimizer state, tables, sparse slots, step), so a
checkpoint written by one algorithm can start another one with the same model (GBA's sync ->
async switch is such a hand-over).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging as absl_logging

# orbax logs every save through absl at WARNING/INFO; a progress bar is what users watch.
absl_logging.set_verbosity(absl_logging.ERROR)


class Checkpointer:
    """Save/restore `TrainState`s under ``directory`` (e.g. ``runs/x/checkpoints``)."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self._mngr = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                                 create=True))

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Write `state` at `step` (blocks until committed, so a stop right after is safe)."""
        self._mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        self._mngr.wait_until_finished()

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore the state at `step` (default latest) with the structure/shapes of `like`.

        Raises:
          FileNotFoundError: no checkpoint in the directory.
          ValueError: the checkpoint's arrays do not match `like` (another model or data schema).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}; nothing to resume "
                                    "(drop --resume to start a new run)")
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)
        try:
            got = self._mngr.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError, TypeError) as e:
            detail = str(e).splitlines()[0][:300]
            raise ValueError(f"checkpoint {self.directory}/{step} does not fit this run's model "
                             f"and data (different --model, sizes or data schema?): {detail}") from e
        return got.state, got.meta

    def close(self) -> None:
        self._mngr.close()
