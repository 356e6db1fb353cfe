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
	$(BIN)/pip install -q -e '.[jit,io,onnx,test,models,serve,dist,onednn,edge]'
	touch $(STAMP)

# issue 35's wasm and web targets (tests/deploy/test_wasm_web.py, make demo): Debian's
# chromium when root and missing, the npm packages playwright-core and onnxruntime-web in
# build/node (ignored), and zig's wasm32-wasi libc built once into its cache, all three at
# once; a failed install only makes those tests skip with the reason.
WEB := build/node
WEB_STAMP := $(WEB)/.installed
NPM_PACKAGES := playwright-core@1.65.1 onnxruntime-web@1.30.0
$(WEB_STAMP): | $(STAMP)
	@mkdir -p $(WEB); \
	if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  ( apt-get install -y -q chromium >$(WEB)/apt.log 2>&1 || { apt-get update -q && \
	    apt-get install -y -q chromium; } >>$(WEB)/apt.log 2>&1 || \
	    echo "apt-get install chromium failed (see $(WEB)/apt.log)" ) & fi; \
	$(BIN)/python -c "from sampan.deploy.wasm import warm_toolchain as w; w()" \
	  >$(WEB)/zig.log 2>&1 & \
	if command -v npm >/dev/null; then npm install -q --prefix $(WEB) --no-audit --no-fund \
	  $(NPM_PACKAGES) >$(WEB)/npm.log 2>&1 || echo "npm install failed (see $(WEB)/npm.log)"; fi; \
	wait; touch $@

demo: $(STAMP) $(WEB_STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP) $(WEB_STAMP)
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

bench: $(BENCH_STAMP) $(WEB_STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python benchmarks/run.py

api-spec: $(STAMP)
	$(BIN)/python tools/api_spec.py --write

clean:
	rm -rf $(VENV) build *.egg-info
	find sampan -name '*.nbi' -delete -o -name '*.nbc' -delete  # numba's kernel caches
