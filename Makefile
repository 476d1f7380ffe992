# The two quick-start targets. Both set everything up first (idempotent, quick when done).
.PHONY: run test setup lint bench

setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/loomrl rollout --env guess_number --model smollm2-135m-instruct --out runs/quickstart --overwrite

test: setup
	.venv/bin/python -m pytest -q --durations=15

lint: setup
	.venv/bin/ruff check loomrl tests benchmarks

bench: setup
	.venv/bin/python benchmarks/engine_throughput.py
