"""Devices and meshes for the SPMD algorithms: one process with N (fake CPU) devices, or N processes.

    init_runtime(cfg)                      before JAX's first operation: devices / jax.distributed
    mesh = make_mesh(cfg, ("data", "model"))   the axes of the algorithm, sized by --mesh

On a CPU host ``--devices N`` sets up N fake CPU devices (``jax_num_cpu_devices``, which must
be set before JAX initialises its backends, PERF_NOTES item 7). With ``spmd.num_processes > 1``
each process calls `jax.distributed.initialize` (CPU: gloo collectives on the coordinator's
host, PERF_NOTES item 8) and contributes ``devices / num_processes`` local devices; the global
device list is ordered by process, so the leading mesh axis (``data``) runs across processes.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
from jax.sharding import Mesh

from recjax.config import Config

_FORCED = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def _backends_initialized() -> bool:
    from jax._src import xla_bridge  # no public query in jax 0.10; read-only use

    return xla_bridge.backends_are_initialized()


def init_runtime(cfg: Config) -> int:
    """Set up this process's devices (and jax.distributed); return the global device count.

    Must run before any JAX operation of the process (the CLI path guarantees it). When JAX is
    already initialised (tests, notebooks), nothing is changed and the first ``--devices``
    devices are used.

    Raises:
      ValueError: ``--devices`` not divisible by ``spmd.num_processes``, or more devices asked
        for than exist.
    """
    sp, want = cfg.spmd, cfg.train.devices
    if sp.num_processes > 1:
        if want and want % sp.num_processes:
            raise ValueError(f"--devices {want} is not divisible by spmd.num_processes="
                             f"{sp.num_processes}; give each process the same number of devices")
        if not sp.coordinator:
            raise ValueError("spmd.num_processes > 1 needs spmd.coordinator=HOST:PORT "
                             "(scripts/launch.py sets it)")
        if not _backends_initialized():
            local = want // sp.num_processes if want else 1
            jax.config.update("jax_num_cpu_devices", local)
            jax.distributed.initialize(sp.coordinator, num_processes=sp.num_processes,
                                       process_id=sp.process_id,
                                       heartbeat_timeout_seconds=sp.heartbeat_timeout)
    elif want and not _backends_initialized():
        forced = _FORCED.search(os.environ.get("XLA_FLAGS", ""))
        if not forced or int(forced.group(1)) < want:
            jax.config.update("jax_num_cpu_devices", want)
    have = jax.device_count()
    if want > have:
        hint = ("" if jax.default_backend() == "cpu" else
                f"; --devices makes fake CPU devices only on the CPU backend, and JAX's "
                f"default backend here is {jax.default_backend()}: set JAX_PLATFORMS=cpu to use them")
        raise ValueError(f"--devices {want}: only {have} devices exist (JAX was initialised "
                         f"before the flag could take effect); lower --devices or start a fresh "
                         f"process{hint}")
    return want or have


def parse_mesh(spec: str, axes: tuple[str, ...]) -> dict[str, int]:
    """``"data=4,model=2"`` -> ``{"data": 4, "model": 2}``; axes not named have size 1.

    Raises:
      ValueError: an axis this algorithm does not have, or a size that is not a positive int.
    """
    sizes = dict.fromkeys(axes, 1)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        if name not in sizes:
            raise ValueError(f"--mesh {spec!r}: unknown axis {name!r}; this algorithm's axes are "
                             f"{', '.join(axes)} (e.g. --mesh {axes[0]}=2,{axes[1]}=2)")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--mesh {spec!r}: axis {name} needs a positive integer size")
        sizes[name] = int(value)
    return sizes


def mesh_shape(spec: str, axes: tuple[str, ...], n_devices: int, default_axis: str) -> dict[str, int]:
    """Axis sizes for ``n_devices``: from ``--mesh``, or every device on ``default_axis``.

    Raises:
      ValueError: the axis sizes do not multiply to the device count.
    """
    if not spec:
        return {a: n_devices if a == default_axis else 1 for a in axes}
    sizes = parse_mesh(spec, axes)
    total = int(np.prod(list(sizes.values())))
    if total != n_devices:
        inner = sizes[axes[1]] if n_devices % sizes[axes[1]] == 0 else 1
        raise ValueError(
            f"--mesh {spec}: the axis sizes multiply to {total}, but {n_devices} devices are in "
            f"use; make the product equal the device count (e.g. --mesh "
            f"{axes[0]}={n_devices // inner},{axes[1]}={inner}) or change --devices")
    return sizes


def make_mesh(sizes: dict[str, int]) -> Mesh:
    """A mesh over the first ``prod(sizes)`` devices, in process order (data axis outermost)."""
    n = int(np.prod(list(sizes.values())))
    devices = np.array(jax.devices()[:n]).reshape(tuple(sizes.values()))
    return Mesh(devices, tuple(sizes))


def check_batch(batch_size: int, n_data: int, what: str = "--batch-size") -> None:
    """Raise unless the global batch splits evenly over the data axis."""
    if batch_size % n_data:
        raise ValueError(f"{what} {batch_size} is not divisible by the data axis ({n_data}); use a "
                         f"multiple of {n_data} (e.g. {batch_size - batch_size % n_data or n_data}) "
                         "or a smaller data axis in --mesh")
