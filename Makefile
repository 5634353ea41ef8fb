# Two commands from a fresh clone: `make run-cluster` and `make test`.
# Both create .venv on first use through `make install`, which is idempotent.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
JOBS   ?= 4

# The test tiers are the directories of tests/ (tests/conftest.py says what each may start).
# `make test` runs the first three, JOBS test processes at a time: most cluster tests wait on
# TensorFlow servers and timeouts more than they compute.
#   test-fast:      tests/fast, nothing started: parsing, data, the verdict, reports, deploy
#                   files, and the fuzz tests' fast profile (< 30 s)
#   test-inprocess: tests/inprocess, sessions and in-process clusters (exact sync
#                   arithmetic, counters)
#   test-cluster:   tests/cluster, whole clusters through the real command line
# Not in `make test`, and run by .ci/run after it, in this order: `make test-convergence`
# (tests/convergence), models trained to near their planted truth, and the MLP on the complete
# MNIST with its SavedModel's scores (about 3 minutes); `make
# test-recovery` (tests/recovery), clusters with faults injected (tasks killed, frozen or
# preempted, a ps that never answers, a worker that starts late, a full disk or a --logdir
# the ps does not share, the chaos soak stopped), which wait out
# timeouts and restarts (6 to 7 minutes); `make test-slurm`
# (tests/slurm), the sbatch script under a real Slurm of its own (root; installs slurm-wlm and
# munge where missing, else skips saying why; a few minutes); `make test-network`
# (tests/network), a worker partitioned on the testbed's network namespaces, and the
# launcher's --isolate off and auto where no namespace can be made (root, else skips saying
# why; about 2 minutes); and `make test-container` (tests/container), the TFJob's pods as
# processes given the operator's TF_CONFIG, and its image
# built with podman and its pods run as containers (root; installs podman, runc and mmdebstrap
# where missing, else skips saying why; keeps only the Debian base's tarball, in
# build/container; 3 to 5 minutes). `make soak` (tests/soak): long runs, not in CI.
TIERS := tests/fast tests/inprocess tests/cluster
# A test process that crashes is not replaced: pytest-xdist 3.8's loadgroup scheduling hangs
# for good once it replaces one (pytest-dev/pytest-xdist#1323, #1327). The run then ends,
# failed, naming the test the process crashed in.
XDIST := -n $(JOBS) --dist loadgroup --max-worker-restart=0

.PHONY: install run-cluster test test-fast test-inprocess test-cluster test-recovery \
	test-convergence test-slurm \
	test-network test-container \
	soak chaos chaos-short bench clean

install: $(STAMP)

# Reinstall when the package metadata changes; the package itself is installed editable.
# tf-keras (the `layers` extra) goes to a directory of its own, on no task's path but the
# Estimator-era example's test's (tests/cluster/test_your_model.py): where TensorFlow finds it,
# every task imports it at start-up (options.before_tensorflow).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
	    --target $(VENV)/layers 'tf-keras>=2.16,<3'
	touch $(STAMP)

run-cluster: install
	$(BIN)/sync-mnist-cluster $(ARGS)

# Each tier's tests have a CPU budget (tests/budget.py): a tier over it fails the run, naming its
# costliest tests.
BUDGET := -p tests.budget --cpu-budget

test: install
	$(BIN)/python -m pytest -q $(XDIST) $(BUDGET) $(TIERS)

test-fast: install
	$(BIN)/python -m pytest -q tests/fast

test-inprocess: install
	$(BIN)/python -m pytest -q tests/inprocess

test-cluster: install
	$(BIN)/python -m pytest -q $(XDIST) tests/cluster

test-recovery: install
	@start=$$(date +%s); $(BIN)/python -m pytest -q $(XDIST) tests/recovery; \
	    code=$$?; echo "test-recovery: the recovery tier took $$(($$(date +%s) - start)) s"; \
	    exit $$code

test-convergence: install
	@start=$$(date +%s); $(BIN)/python -m pytest -q $(XDIST) tests/convergence; \
	    code=$$?; echo "test-convergence: the convergence tier took $$(($$(date +%s) - start)) s"; \
	    exit $$code

test-slurm: install
	@start=$$(date +%s); $(BIN)/python -m pytest -q -rs tests/slurm; \
	    code=$$?; echo "test-slurm: the real-Slurm tier took $$(($$(date +%s) - start)) s"; \
	    exit $$code

test-network: install
	@start=$$(date +%s); $(BIN)/python -m pytest -q -rs tests/network; \
	    code=$$?; echo "test-network: the network tier took $$(($$(date +%s) - start)) s"; \
	    exit $$code

test-container: install
	@start=$$(date +%s); $(BIN)/python -m pytest -q -rs tests/container; \
	    code=$$?; echo "test-container: the container tier took $$(($$(date +%s) - start)) s"; \
	    exit $$code

# The long cluster runs (tests/soak), then the fuzz tests with Hypothesis's "soak" profile
# (conftest.py): 10,000 examples per entry point, with their counts per test at the end.
soak: install
	$(BIN)/python -m pytest -q tests/soak
	$(BIN)/python -m pytest -q --hypothesis-profile=soak --hypothesis-show-statistics \
	    tests/fast/test_fuzz.py

# The chaos soak: the localhost cluster again and again, each run with one random fault
# (a signal, a network fault or a full disk, of a random task at a random moment), every
# outcome classified against the README (docs/chaos.md). About 15 minutes; `make chaos
# ARGS=--quick` is 4 runs (the soak tier runs those). A fault kind this machine cannot make
# (the network and disk kinds need root, nftables and iptables) stops it, exit 2, unless
# skipped: `make chaos ARGS="--skip KIND[,KIND]"`. Writes chaos-results/chaos.json.
chaos: install
	$(BIN)/python -m lab.chaos $(ARGS)

# The short chaos, run by .ci/run after the other tiers: every fault kind once (a fixed seed),
# then the end-of-run replays (a ps frozen, a worker frozen, the ps killed as the cluster
# finishes), each beside fault-free runs for load; any defect fails it (but a known, filed
# one: docs/chaos.md), and so does a fault kind it cannot make. About 8 minutes on this
# project's 2-core machine, the CPU lock held (5 December 2026: 21 runs in 462 s). Writes
# chaos-results/chaos-short.json.
chaos-short: install
	$(BIN)/python -m lab.chaos --short $(ARGS)

# About 12 minutes on a quiet 2-core machine; `make bench ARGS=--quick` about 2. Writes
# bench-results/. The plot needs the optional `bench` extra (matplotlib), the DDP row the `ddp`
# extra (PyTorch); if one cannot be installed, the bench says so and runs without it.
bench: install
	test -f $(VENV)/.bench-extra || { $(BIN)/python -m pip install --quiet \
	    --disable-pip-version-check -e '.[bench]' && touch $(VENV)/.bench-extra; } || \
	    echo "matplotlib could not be installed: no plot"
	test -f $(VENV)/.ddp-extra || { $(BIN)/python -m pip install --quiet \
	    --disable-pip-version-check -e '.[ddp]' && touch $(VENV)/.ddp-extra; } || \
	    echo "PyTorch could not be installed: no ddp row"
	$(BIN)/sync-mnist-bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
