# The two commands a new user runs: `make demo` and `make test`. Each does its own setup.
PY := .venv/bin/python
.PHONY: setup setup-vllm demo demo-harness test test-fast bench clean

setup:
	@bash scripts/setup.sh

# vLLM's CPU build in .venv-vllm (its own versions); the live vLLM tests need it.
setup-vllm:
	@bash scripts/setup_vllm.sh

demo: setup
	@$(PY) -m opencomposer.cli demo

demo-harness: setup
	@$(PY) -m opencomposer.cli demo --harness

test: setup setup-vllm
	@$(PY) -X faulthandler -m pytest -q -x --durations=15 tests

test-fast: setup
	@$(PY) -m pytest -q -x -m "not slow and not ray" tests

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf .venv .venv-vllm build *.egg-info .pytest_cache
