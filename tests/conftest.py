"""Test setup: 8 fake CPU devices (set before JAX starts), the compile cache, the real-data location."""

import json
import os
import pathlib
import subprocess
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from recjax import compile_cache  # noqa: E402

# The tests' own persistent compilation cache, every program written (min 0 s): the tests build
# the same small programs again and again in new closures, and each is compiled once and loaded
# after, even in a first run (docs/testing.md, "How long the suite takes"). Same executables,
# same bits. RECJAX_TEST_COMPILE_CACHE=off compiles everything; a directory uses that one.
compile_cache.enable(os.environ.get("RECJAX_TEST_COMPILE_CACHE")
                     or compile_cache.directory("auto") + "-tests", min_seconds=0.0)

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("RECJAX_DATA", ROOT.parent / "shared" / "data"))


def assert_same_arrays(got, want) -> None:
    """Every field of two named tuples of arrays (a `Chunk`, a `Batch`): None in both, or the
    same dtype, shape and values."""
    import numpy as np

    for name, a, b in zip(want._fields, got, want):
        if b is None:
            assert a is None, name
            continue
        assert (a.dtype, a.shape) == (b.dtype, b.shape), name
        np.testing.assert_array_equal(a, b, err_msg=name)


def data_path(*parts: str) -> pathlib.Path:
    """Path to a real-data sample, or skip the test with the reason when it is absent."""
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real data sample {p} not present (set RECJAX_DATA to the data folder)")
    return p


def smoke_study(name: str, out: pathlib.Path) -> dict:
    """``scripts/compare.py NAME --smoke --datasets synthetic`` run as a user runs it (its own
    process, one CPU device), and the study's JSON results."""
    subprocess.run([sys.executable, "scripts/compare.py", name, "--smoke", "--datasets",
                    "synthetic", "--out", str(out)], check=True, capture_output=True, cwd=ROOT,
                   env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    return json.loads((out / f"{name}_study.json").read_text())


def spy_blocks(monkeypatch, source_cls) -> list[bool]:
    """Record, per block the reader's whole-block path is offered, whether `source_cls`'s
    ``convert_block`` took it whole (True) or declined it to the token path (False)."""
    calls: list[bool] = []
    real = source_cls.convert_block

    def spy(self, cols):
        out = real(self, cols)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(source_cls, "convert_block", spy)
    return calls


@pytest.fixture(scope="module")
def cluster():
    """One local Ray instance (2 CPUs) for a test module's Ray tests (tests/test_ray_*.py): a
    run that finds Ray running kills only its own actors."""
    from algorithms.runtime import ray_backend
    from recjax.config import RayConfig

    c = ray_backend.Cluster(RayConfig(num_cpus=2))
    yield c
    c.stop()
