"""The bodies of the `scripts/` entry points that need no algorithm: `collect` (runs -> one
table) and `plot` (overlaid curves). Each script is a thin entry point calling ``main``; tests
call it in-process (nothing in scripts/ is imported by the library or the tests)."""
