.PHONY: setup run test test-fast bench

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
