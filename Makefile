PY ?= python
# Tests use 8 fake CPU devices (tests/conftest.py); two workers fit the 2-core CI machine.
PYTEST_WORKERS ?= 2

.PHONY: install test test-all lint bench train mutants

# Dependencies, then recjax itself (editable): `import recjax` works from any directory.
install:
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install -e .

test:
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=10

test-all:
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) -m "" --durations=20

lint:
	$(PY) -m ruff check .

# Mutation testing (mutmut) of the modules in recjax/tools/mutants.py's GROUPS, one mutant at a time;
# hours on the 2-core box (scripts/mutants.py GROUP --only REPORT re-runs one report's survivors).
# Numbers and equivalent survivors: docs/testing.md.
mutants:
	$(PY) scripts/mutants.py

bench:
	$(PY) scripts/bench.py

train:
	$(PY) scripts/train.py
