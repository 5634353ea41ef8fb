# Two commands from a fresh clone: `make run-cluster` and `make test`.
# Both create .venv on first use through `make install`, which is idempotent.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: install run-cluster test soak bench clean

install: $(STAMP)

# Reinstall when the package metadata changes; the package itself is installed editable.
$(STAMP): setup.py setup.cfg
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run-cluster: install
	$(BIN)/sync-mnist-cluster $(ARGS)

test: install
	$(BIN)/python -m pytest -q

soak: install
	$(BIN)/python -m pytest -q -m soak

# About 10 minutes on a quiet 2-core machine; `make bench ARGS=--quick` about 2. Writes
# bench-results/. The plot needs the optional `bench` extra (matplotlib); if it cannot be
# installed, the bench says so and still writes the table and the JSON.
bench: install
	test -f $(VENV)/.bench-extra || { $(BIN)/python -m pip install --quiet \
	    --disable-pip-version-check -e '.[bench]' && touch $(VENV)/.bench-extra; } || \
	    echo "matplotlib could not be installed: no plot"
	$(BIN)/sync-mnist-bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
