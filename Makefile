# Two commands from a fresh clone: `make run-cluster` and `make test`.
# Both create .venv on first use through `make install`, which is idempotent.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
JOBS   ?= 4

# The test tiers. `make test` runs all of them (not the soak), JOBS test processes at a time:
# most cluster tests wait on TensorFlow servers and timeouts more than they compute.
#   test-fast:      no TensorFlow in the test process: parsing, data, reports, deploy files (< 30 s)
#   test-inprocess: graphs and in-process clusters (exact sync arithmetic, counters)
#   test-cluster:   whole clusters through the real command line
FAST_TESTS := tests/test_cli_errors.py tests/test_config_cluster.py tests/test_data.py \
              tests/test_real_data.py tests/test_netns.py tests/test_task_identity.py \
              tests/test_tfjob.py tests/test_slurm.py tests/test_watch.py \
              tests/test_experiment_tools.py
INPROCESS_TESTS := tests/test_model.py tests/test_verify.py tests/test_membership.py \
                   tests/test_partition.py \
                   tests/test_sync_cluster.py tests/test_rejoin.py tests/test_ps.py \
                   tests/test_early_stop.py

.PHONY: install run-cluster test test-fast test-inprocess test-cluster soak bench clean

install: $(STAMP)

# Reinstall when the package metadata changes; the package itself is installed editable.
$(STAMP): setup.py setup.cfg
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run-cluster: install
	$(BIN)/sync-mnist-cluster $(ARGS)

test: install
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup

test-fast: install
	$(BIN)/python -m pytest -q -m "not cluster" $(FAST_TESTS)

test-inprocess: install
	$(BIN)/python -m pytest -q $(INPROCESS_TESTS)

test-cluster: install
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup -m cluster $(addprefix --ignore=,$(INPROCESS_TESTS))

soak: install
	$(BIN)/python -m pytest -q -m soak

# About 12 minutes on a quiet 2-core machine; `make bench ARGS=--quick` about 2. Writes
# bench-results/. The plot needs the optional `bench` extra (matplotlib); if it cannot be
# installed, the bench says so and still writes the table and the JSON.
bench: install
	test -f $(VENV)/.bench-extra || { $(BIN)/python -m pip install --quiet \
	    --disable-pip-version-check -e '.[bench]' && touch $(VENV)/.bench-extra; } || \
	    echo "matplotlib could not be installed: no plot"
	$(BIN)/sync-mnist-bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
