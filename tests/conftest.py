"""Test setup: 8 fake CPU devices (set before JAX starts) and the real-data location."""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("RECJAX_DATA", ROOT.parent / "shared" / "data"))


def data_path(*parts: str) -> pathlib.Path:
    """Path to a real-data sample, or skip the test with the reason when it is absent."""
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real data sample {p} not present (set RECJAX_DATA to the data folder)")
    return p
