"""The bodies of the `scripts/` entry points that run algorithms: the benchmarks `bench` (every
section, in one process), `bench_gpu`, `bench_ray`, `bench_persia`, `bench_runtime`, `bench_gba`
and `bench_lru`, whose training runs go through `algorithms.run` (`roles` times the roles'
run inside one). Each script is a thin entry point calling the module's ``main``; the ones
that need no algorithm live in `recjax.tools` (nothing in scripts/ is imported by the library
or the tests)."""
