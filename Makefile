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
#   test-fast:      no TensorFlow server: parsing, data, reports, deploy files, and
#                   the fuzz tests' fast profile (< 30 s)
#   test-inprocess: graphs and in-process clusters (exact sync arithmetic, counters)
#   test-cluster:   whole clusters through the real command line
# Not in `make test`: `make test-slurm`, the sbatch script under a real Slurm of its own (root;
# installs slurm-wlm and munge where missing, else skips saying why; a few minutes), which
# .ci/run runs after `make test`.
FAST_TESTS := tests/test_cli_errors.py tests/test_config_cluster.py tests/test_data.py \
              tests/test_real_data.py tests/test_netns.py tests/test_task_identity.py \
              tests/test_tfjob.py tests/test_watch.py \
              tests/test_experiment_tools.py tests/test_verify.py tests/test_fuzz.py
INPROCESS_TESTS := tests/test_model.py tests/test_membership.py \
                   tests/test_partition.py \
                   tests/test_sync_cluster.py tests/test_rejoin.py tests/test_ps.py \
                   tests/test_early_stop.py

.PHONY: install run-cluster test test-fast test-inprocess test-cluster test-slurm soak chaos bench clean

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

test-slurm: install
	@start=$$(date +%s); $(BIN)/python -m pytest -q -rs -m slurm tests/test_slurm_real.py; \
	    code=$$?; echo "test-slurm: the real-Slurm tier took $$(($$(date +%s) - start)) s"; \
	    exit $$code

# The long cluster runs, then the fuzz tests with Hypothesis's "soak" profile (conftest.py):
# 10,000 examples per entry point, with their counts per test at the end.
soak: install
	$(BIN)/python -m pytest -q -m soak
	$(BIN)/python -m pytest -q -m fuzz --hypothesis-profile=soak --hypothesis-show-statistics \
	    tests/test_fuzz.py

# The chaos soak: the localhost cluster again and again, each run with one random fault
# (SIGKILL, or SIGSTOP then SIGCONT, of a random task at a random moment), every outcome
# classified against the README. About 15 minutes; `make chaos ARGS=--quick` is 3 runs (the
# soak tier runs those). Writes chaos-results/chaos.json.
chaos: install
	$(BIN)/python -m sync_mnist.experiments.chaos $(ARGS)

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
