# The two quick-start targets. Both set everything up first (idempotent, quick when done).
.PHONY: run test setup lint bench

setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/loomrl rollout --env arith --model smollm2-135m-instruct --examples 16 --n 4 --max-tokens 48 --out runs/quickstart --overwrite

# Unit tests in two workers, then the real-engine (e2e) tests alone: they time kills and
# restarts of real processes and need the CPU to themselves (run beside the unit tests at
# a lower priority, they were measured 40% slower, and the whole no faster). The e2e
# tests all live in tests/e2e (tests/test_suite_layout.py keeps it so): only those
# modules are collected.
test: setup
	.venv/bin/python -m pytest -q -n 2 --dist loadgroup -m "not e2e" --durations=10; unit=$$?; \
	.venv/bin/python -m pytest -q -m e2e --durations=15 tests/e2e; e2e=$$?; \
	test $$unit -eq 0 && test $$e2e -eq 0

lint: setup
	.venv/bin/ruff check loomrl tests benchmarks

bench: setup
	.venv/bin/python benchmarks/engine_throughput.py
