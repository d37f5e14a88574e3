.PHONY: setup run test bench

setup:
	@./scripts/setup.sh

run: setup
	@.venv/bin/bastion run

test: setup
	@.venv/bin/python -m pytest -q

bench: setup
	@.venv/bin/python bench/dataplane.py
	@.venv/bin/python bench/http_dataplane.py
