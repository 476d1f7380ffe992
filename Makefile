# The two quick-start targets. Both set everything up first (idempotent, quick when done).
.PHONY: run test setup lint bench

setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/loomrl rollout --env arith --model smollm2-135m-instruct --examples 16 --n 4 --max-tokens 48 --out runs/quickstart --overwrite

test: setup
	.venv/bin/python -m pytest -q --durations=15

lint: setup
	.venv/bin/ruff check loomrl tests benchmarks

bench: setup
	.venv/bin/python benchmarks/engine_throughput.py
