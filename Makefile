.PHONY: setup run test test-fast bench lock audit

# Workers for the test suite: one more than the cores, as most tests spend their time waiting on the processes
# they start. `make test TEST_WORKERS=0` runs everything in this one process, in order.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
PYTEST = .venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile
# The inner loop: the sans-I/O protocol core and the deciders (policy, guardrails, search, catalog) on their own;
# nothing marked slow, and none of the files that run a gateway or a command end to end.
FAST_TESTS = tests/protocol tests/transport tests/policy tests/guardrails tests/search tests/gateway_units \
	tests/test_dependency_direction.py
NOT_FAST = --ignore-glob='*end_to_end*' --ignore-glob='*_gateway.py' --ignore-glob='*cli.py' --ignore-glob='*_bench.py'

setup:
	@./scripts/setup.sh

run: setup
	@.venv/bin/bastion run

test: setup
	@$(PYTEST) --durations=10

test-fast: setup
	@$(PYTEST) -m "not slow" $(NOT_FAST) $(FAST_TESTS)

bench: setup
	@.venv/bin/python bench/dataplane.py
	@.venv/bin/python bench/http_dataplane.py

# Bastion's own dependencies, locked with hashes for Python 3.11 on Linux x86-64 (requirements.lock: the runtime;
# requirements-dev.lock: with the dev extra), and audited against the index's vulnerability data. Neither is part of
# `make test` (both need the network); tests/test_lock.py checks offline that the locks agree with pyproject.toml.
# The tools live in their own venv under .cache, not among Bastion's dependencies.
SUPPLY_TOOLS = .cache/supply-tools
# pip-audit's source of vulnerability data: pypi (the index's JSON API) or osv.
AUDIT_SERVICE ?= pypi
SUPPLY_TOOLS_STAMP = $(SUPPLY_TOOLS)/uv-0.13.8-pip-audit-2.10.1
LOCK_FLAGS = --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--custom-compile-command "make lock" --quiet

$(SUPPLY_TOOLS_STAMP):
	python3 -m venv $(SUPPLY_TOOLS)
	$(SUPPLY_TOOLS)/bin/python -m pip install -q uv==0.13.8 pip-audit==2.10.1
	touch $@

lock: $(SUPPLY_TOOLS_STAMP)
	$(SUPPLY_TOOLS)/bin/uv pip compile pyproject.toml $(LOCK_FLAGS) -o requirements.lock
	$(SUPPLY_TOOLS)/bin/uv pip compile pyproject.toml --extra dev $(LOCK_FLAGS) -o requirements-dev.lock

audit: $(SUPPLY_TOOLS_STAMP)
	@$(SUPPLY_TOOLS)/bin/python scripts/audit.py $(AUDIT_SERVICE) requirements.lock requirements-dev.lock
