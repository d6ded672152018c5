"""Training algorithms, one module each, dispatched by `--algo` (DESIGN.md section 5).

Each entry of `RUNNERS` maps an algorithm name to ``run(cfg) -> summary dict``. SPMD algorithms
pass a `recjax.train.loop.Strategy` to the shared trainer; host-async ones drive the runtime.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from algorithms import async_ps, gba, shadowsync
from algorithms.runtime.segments import HOST_ASYNC, run_in_segments
from recjax.config import Config
from recjax.train import loop

RUNNERS: dict[str, Callable[[Config], dict]] = {"single": loop.run}
RUNNERS["sync"] = lambda cfg: __import__("algorithms.sync", fromlist=["run"]).run(cfg)
RUNNERS["des"] = lambda cfg: __import__("algorithms.des", fromlist=["run"]).run(cfg)
RUNNERS.update({"async": async_ps.run, "shadow": shadowsync.run, "fr": shadowsync.run,
                "gba": gba.run})
RUNNERS["persia"] = lambda cfg: __import__("algorithms.persia", fromlist=["run"]).run(cfg)


def run(cfg: Config) -> dict:
    """Run `cfg.train.algo`, or say which algorithms exist when it is not implemented yet."""
    if cfg.train.algo == "single" and cfg.train.devices > 1:
        raise ValueError(f"--algo single trains on one device; for --devices {cfg.train.devices} "
                         "use --algo sync (data/model parallel) or --algo des")
    if cfg.embed.store == "lru" and cfg.train.algo in ("single", "sync", "des"):
        raise ValueError(f"--embed.store lru (dynamic ids in an LRU parameter server) runs with the "
                         f"host-async algorithms (async, shadow, fr, gba, persia), not --algo "
                         f"{cfg.train.algo}; use --embed.store fixed (hashed tables) there")
    backend = cfg.runtime.backend
    if backend != "threads" and cfg.train.algo in ("single", "sync", "des"):
        raise ValueError(f"--backend {backend} chooses how the host-async algorithms (async, shadow, "
                         f"fr, gba, persia) run their roles; --algo {cfg.train.algo} is SPMD (for "
                         "several processes use scripts/launch.py); drop --backend")
    if backend == "ray" and cfg.train.deterministic:
        raise ValueError("--deterministic runs the roles on the virtual clock in one process; it "
                         "cannot be combined with --backend ray (drop one of them)")
    if backend == "virtual":  # the same as --deterministic
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=True))
    if cfg.train.algo not in RUNNERS:
        raise ValueError(f"--algo {cfg.train.algo} is not implemented yet; available: "
                         f"{', '.join(sorted(RUNNERS))}")
    try:
        if cfg.train.algo in HOST_ASYNC:  # checkpoint to checkpoint (train.ckpt_every)
            return run_in_segments(RUNNERS[cfg.train.algo], cfg)
        return RUNNERS[cfg.train.algo](cfg)
    finally:  # whatever happened, no Ray process of this run outlives it
        if "algorithms.runtime.ray_backend" in sys.modules:
            sys.modules["algorithms.runtime.ray_backend"].shutdown()
