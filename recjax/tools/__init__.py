"""The bodies of the `scripts/` entry points that need no algorithm: `collect` (runs -> one
table), `plot` (overlaid curves), `sweep` (a grid of train.py runs), `launch` (N processes
through jax.distributed), `faults` (kill and resume runs), `mutants` (mutation testing) and
`bench_spmd`; with `bench_dlrm` (the plain-JAX reference step) and `bench_torch` (the PyTorch
peers) that the benchmarks measure against. Each script is a thin entry point calling
``main``; tests call it in-process (nothing in scripts/ is imported by the library or the
tests); the bodies that run algorithms live in `algorithms.tools`."""
