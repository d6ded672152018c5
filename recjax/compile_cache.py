"""JAX's persistent compilation cache, on by default (``train.compile_cache``, ``--no-compile-cache``).

Every run of scripts/train.py used to compile its jitted steps from scratch: seconds per run on
a 2-core CPU, and the same programs again in every run of a sweep or a study. With the cache, a
second run with the same shapes loads the executables XLA wrote the first time (same
executables, so the same bits).

Where: ``train.compile_cache`` = ``auto`` -> ``$RECJAX_CACHE/jax`` (``RECJAX_CACHE`` defaults to
``~/.cache/recjax``); ``off`` -> no persistent cache; anything else is the directory itself.
The tests use ``$RECJAX_CACHE/jax-tests`` (tests/conftest.py).
"""

from __future__ import annotations

import os

# Programs that compile faster than this are not written (jax's default is 1 s; the steps of
# small models compile in ~0.3-1 s on a 2-core CPU, and those are what a sweep repeats).
MIN_COMPILE_SECONDS = 0.2


def directory(setting: str) -> str | None:
    """The cache directory that `setting` means, or None for ``off``."""
    if setting == "off":
        return None
    if setting == "auto":
        root = os.environ.get("RECJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "recjax")
        return os.path.join(root, "jax")
    return setting


def enable(setting: str, min_seconds: float = MIN_COMPILE_SECONDS) -> str | None:
    """Point jax's persistent compilation cache at `setting`'s directory, writing the programs
    that take at least `min_seconds` to compile; returns the directory in use (or None).

    Call before the first jit compiles (scripts/train.py and `recjax.fit` do). A process keeps
    the first cache it was given: a later call changes nothing and returns that one (the
    tests' own cache, tests/conftest.py, stays theirs through every `fit` they call).
    """
    path = directory(setting)
    if path is None:
        return None
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
