# The two commands: `make demo` and `make test`. Both create .venv when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench api-spec lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[jit,io,onnx,test,models,serve,dist,onednn]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python tools/api_spec.py --check
	$(BIN)/lint-imports  # the floors of DESIGN.md (.importlinter)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile  # a file's tests (and its module fixtures) on one worker

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# the benchmarks' extra peers (JAX) on top of the test deps; make test / demo don't need them
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[jit,io,onnx,test,models,serve,dist,onednn,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python benchmarks/run.py

api-spec: $(STAMP)
	$(BIN)/python tools/api_spec.py --write

clean:
	rm -rf $(VENV) build *.egg-info
	find sampan -name '*.nbi' -delete -o -name '*.nbc' -delete  # numba's kernel caches
