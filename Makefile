PY ?= python
# Tests use 8 fake CPU devices (tests/conftest.py); two workers fit the 2-core CI machine.
PYTEST_WORKERS ?= 2

.PHONY: install test test-all test-peer lint bench train mutants

# Dependencies, then recjax itself (editable): `import recjax` works from any directory.
install:
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install -e .

test:
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=10

# worksteal: the slow tests sit together late in the collection order, and xdist's default `load`
# leaves one worker to run them while the other waits, ~19 of a cold run's 56 minutes replayed
# (scripts/suite_schedule.py; docs/testing.md, "How long the suite takes").
test-all:
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "" --durations=20

# DCN-v2 and DIN against DeepCTR-Torch and TorchRec (tests/test_peer_models.py): a test-only
# extra in its own virtual environment that sees this one (requirements-peer.txt), made on first
# use; never needed by test / test-all, where those tests skip.
# PEER_PIP_ARGS= (empty) where a local mirror has the +cpu torch wheel and PyTorch's index is out of reach.
PEER_VENV ?= .venv-peer
PEER_PIP_ARGS ?= --extra-index-url https://download.pytorch.org/whl/cpu
$(PEER_VENV)/.installed: requirements-peer.txt
	$(PY) -m venv --system-site-packages $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --no-deps $(PEER_PIP_ARGS) -r requirements-peer.txt
	touch $@

test-peer: $(PEER_VENV)/.installed
	$(PEER_VENV)/bin/python -m pytest -q -rs tests/test_peer_models.py

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
