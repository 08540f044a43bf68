# localspec — `make run` starts the app (installing on first use); `make test` runs the test suite.
#
# llama-cpp-python is compiled from source with the flags of DESIGN §5:
# -DGGML_LLAMAFILE=OFF always (bit-identical batched logits), -DGGML_CUDA=on
# when nvcc and an NVIDIA GPU are found, Metal automatically on macOS. pip's wheel cache does not
# key on CMAKE_ARGS, so the built wheel is kept in a folder named after the
# version, the flags and the Python/platform, and installed from there.

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
LLAMA_CPP   := 0.3.36
# CUDA only where both the compiler and a GPU are present (nvcc alone is not enough)
CUDA_FLAG   := $(if $(and $(shell command -v nvcc 2>/dev/null),$(shell nvidia-smi -L 2>/dev/null)),-DGGML_CUDA=on,)
CMAKE_FLAGS ?= -DGGML_LLAMAFILE=OFF $(CUDA_FLAG)
WHEEL_CACHE ?= $(HOME)/.cache/localspec/wheels
WHEEL_KEY   := $(shell $(PYTHON) -c "import hashlib,platform,sys;print(hashlib.sha256(('$(LLAMA_CPP)|$(strip $(CMAKE_FLAGS))|'+platform.machine()+'|'+platform.system()+'|'+sys.version.split()[0]).encode()).hexdigest()[:12])")
WHEEL_DIR   := $(WHEEL_CACHE)/llama-cpp-python-$(LLAMA_CPP)-$(WHEEL_KEY)
STAMP       := $(VENV)/.localspec-$(WHEEL_KEY)
PIP         := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: run install install-dev models test test-fast bench doctor clean

run: install
	$(BIN)/localspec ui

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if ! ls $(WHEEL_DIR)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP) with CMAKE_ARGS='$(strip $(CMAKE_FLAGS))' (first time only, ~6 minutes)"; \
	  rm -rf $(WHEEL_DIR).tmp && mkdir -p $(WHEEL_DIR).tmp && \
	  CMAKE_ARGS="$(strip $(CMAKE_FLAGS))" $(PIP) wheel --no-deps --no-cache-dir -w $(WHEEL_DIR).tmp "llama-cpp-python==$(LLAMA_CPP)" && \
	  rm -rf $(WHEEL_DIR) && mv $(WHEEL_DIR).tmp $(WHEEL_DIR); \
	fi
	$(PIP) install -q --force-reinstall --no-deps $(WHEEL_DIR)/llama_cpp_python-*.whl
	$(PIP) install -q -e .
	@printf '{"wheel": "%s", "cmake_args": "%s", "wheel_dir": "%s"}\n' \
	  "$$(basename $(WHEEL_DIR)/llama_cpp_python-*.whl)" "$(strip $(CMAKE_FLAGS))" "$(WHEEL_DIR)" > $(VENV)/localspec-llama-build.json
	@rm -f $(VENV)/.localspec-* && touch $@

install-dev: $(VENV)/.dev-installed

$(VENV)/.dev-installed: $(STAMP)
	$(PIP) install -q -e '.[dev]'
	@touch $@

models: install
	$(BIN)/localspec models prepare --with-test-models

test: install-dev models
	$(BIN)/python -m pytest -n 2 --timeout 900

test-fast: install-dev
	$(BIN)/python -m pytest -n 2 -m "not models and not browser"

bench: install
	$(BIN)/localspec bench

doctor: install
	$(BIN)/localspec doctor

clean:
	rm -rf $(VENV) build *.egg-info
