# localspec — `make run` starts the app (installing on first use); `make test` runs the test suite.
#
# llama-cpp-python is compiled from its sdist with the flags of docs/design.md (Batch invariance):
# -DGGML_LLAMAFILE=OFF always (bit-identical batched logits), -DGGML_RPC=ON (a target split over
# machines), -DGGML_CUDA=on when nvcc and an NVIDIA GPU are found, Metal automatically on macOS, and
# with the patches patches/series lists, in its order (each file's header says what it changes, why and
# what it measured). pip's wheel cache does not key on CMAKE_ARGS or patches, so the built wheel is kept
# in a folder named after the version, the flags, the patches' hash and the Python/platform, and
# installed from there.

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
LLAMA_CPP   := 0.3.36
comma       := ,
# CUDA only where both the compiler and a GPU are present (nvcc alone is not enough). nvcc is looked for on PATH,
# then where the CUDA toolkit installs it without touching PATH (CUDA_DIRS); CMake is then told where it is
CUDA_DIRS   ?= $(if $(CUDA_HOME),$(CUDA_HOME)/bin) /usr/local/cuda/bin
NVIDIA_GPU  := $(shell nvidia-smi -L 2>/dev/null)
NVCC_PATH   := $(shell command -v nvcc 2>/dev/null)
NVCC        := $(or $(NVCC_PATH),$(firstword $(wildcard $(addsuffix /nvcc,$(CUDA_DIRS)))))
CUDA_FLAG   := $(if $(and $(NVCC),$(NVIDIA_GPU)),-DGGML_CUDA=on$(if $(NVCC_PATH),, -DCMAKE_CUDA_COMPILER=$(NVCC)),)
CPU_ON_GPU  := $(if $(and $(NVIDIA_GPU),$(if $(NVCC),,none)),an NVIDIA GPU is present but no CUDA compiler (nvcc on PATH$(comma) in CUDA_HOME/bin or /usr/local/cuda/bin): building for the CPU. Install the CUDA toolkit and run make install again to use the GPU,)
# Linux: a C++ runtime a toolchain links statically into each library stays private to it; exported, the
# libraries bind to each other's copy and a CUDA model load crashed (docs/gpu.md, "The crash at load")
PRIVATE_CXX := $(if $(filter Linux,$(shell uname -s)),-DCMAKE_SHARED_LINKER_FLAGS=-Wl$(comma)--exclude-libs$(comma)ALL,)
# RPC: a target split over machines with llama.cpp's rpc-server (docs/rpc.md)
CMAKE_FLAGS ?= -DGGML_LLAMAFILE=OFF -DGGML_RPC=ON $(CUDA_FLAG) $(PRIVATE_CXX)
WHEEL_CACHE ?= $(HOME)/.cache/localspec/wheels
# patches/series lists the patches in the order they apply; the build key hashes their diffs (a file's
# header, the prose above its first "--- " line, is documentation and does not change the build)
# (PATCH_KIND=invariance: only the patches whose header says "Kind: invariance", for make patches-bits)
PATCH_KIND  ?=
PATCHES     := $(addprefix patches/,$(shell grep -v '^\#' patches/series))
ifneq ($(PATCH_KIND),)
PATCHES     := $(foreach p,$(PATCHES),$(if $(shell grep -l '^Kind: $(PATCH_KIND)$$' $(p)),$(p)))
endif
PATCH_HASH  := $(shell $(PYTHON) -c "import hashlib,sys;h=hashlib.sha256();[h.update(d[0 if d.startswith(b'--- ') else d.find(b'\n--- ')+1:]) for d in (open(p,'rb').read() for p in sys.argv[1:])];print(h.hexdigest()[:12])" $(PATCHES))
WHEEL_KEY   := $(shell $(PYTHON) -c "import hashlib,platform,sys;print(hashlib.sha256(('$(LLAMA_CPP)|$(strip $(CMAKE_FLAGS))|$(PATCH_HASH)|'+platform.machine()+'|'+platform.system()+'|'+sys.version.split()[0]).encode()).hexdigest()[:12])")
WHEEL_DIR   := $(WHEEL_CACHE)/llama-cpp-python-$(LLAMA_CPP)-$(WHEEL_KEY)
STAMP       := $(VENV)/.localspec-$(WHEEL_KEY)
PIP         := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: cmake-flags run install install-dev models test test-fast lint patches-check patches-portable patches-bits bench bench-llama-cpp llama-cpp-tools doctor gpu-pack clean

run: install
	$(BIN)/localspec ui

install: $(STAMP)

$(STAMP): pyproject.toml $(PATCHES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if ! ls $(WHEEL_DIR)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP) with CMAKE_ARGS='$(strip $(CMAKE_FLAGS))' and $(words $(PATCHES)) patch(es) (first time only: ~6 minutes on two cores$(if $(CUDA_FLAG),; with CUDA ~4 minutes on 16 cores$(comma) far longer on few))"; \
	  $(if $(CPU_ON_GPU),echo "note: $(CPU_ON_GPU)";) \
	  rm -rf $(WHEEL_DIR).tmp && mkdir -p $(WHEEL_DIR).tmp/src && \
	  $(PIP) download -q --no-deps --no-binary :all: --no-cache-dir -d $(WHEEL_DIR).tmp "llama-cpp-python==$(LLAMA_CPP)" && \
	  tar -xzf $(WHEEL_DIR).tmp/llama_cpp_python-$(LLAMA_CPP).tar.gz -C $(WHEEL_DIR).tmp/src --strip-components=1 && \
	  for p in $(abspath $(PATCHES)); do patch -s -p1 -d $(WHEEL_DIR).tmp/src < $$p || exit 1; done && \
	  CMAKE_ARGS="$(strip $(CMAKE_FLAGS))" $(PIP) wheel --no-deps --no-cache-dir -w $(WHEEL_DIR).tmp $(WHEEL_DIR).tmp/src && \
	  mkdir -p $(WHEEL_DIR).new && mv $(WHEEL_DIR).tmp/llama_cpp_python-*.whl $(WHEEL_DIR).new/ && \
	  rm -rf $(WHEEL_DIR) $(WHEEL_DIR).tmp && mv $(WHEEL_DIR).new $(WHEEL_DIR); \
	fi
	$(PIP) install -q --force-reinstall --no-deps $(WHEEL_DIR)/llama_cpp_python-*.whl
	$(PIP) install -q -e .
	@printf '{"wheel": "%s", "cmake_args": "%s", "patches": "%s", "patch_hash": "%s", "wheel_dir": "%s"}\n' \
	  "$$(basename $(WHEEL_DIR)/llama_cpp_python-*.whl)" "$(strip $(CMAKE_FLAGS))" "$(notdir $(PATCHES))" "$(PATCH_HASH)" "$(WHEEL_DIR)" > $(VENV)/localspec-llama-build.json
	@rm -f $(VENV)/.localspec-* && touch $@

install-dev: $(VENV)/.dev-installed

$(VENV)/.dev-installed: $(STAMP)
	$(PIP) install -q -e '.[dev]'
	@touch $@

models: install
	$(BIN)/localspec models prepare --with-test-models

test: install-dev models patches-check patches-portable lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup --timeout 900

lint: install-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

test-fast: install-dev
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not models and not browser"

# the series still applies to a clean sdist, each patch exactly where it was made (no fuzz); the sdist is
# downloaded once into the cache (options GNU and BSD patch share: macOS has the latter)
SDIST := $(HOME)/.cache/localspec/sdist/llama_cpp_python-$(LLAMA_CPP).tar.gz
$(SDIST):
	@mkdir -p $(dir $@) && $(PYTHON) -m pip download -q --no-deps --no-binary :all: --no-cache-dir -d $(dir $@) "llama-cpp-python==$(LLAMA_CPP)"

patches-check: $(SDIST)
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && tar -xzf $(SDIST) -C $$tmp --strip-components=1 && \
	  for p in $(PATCHES); do patch -s -p1 -N --fuzz=0 -d $$tmp < $$p >/dev/null || \
	    { echo "$$p no longer applies to llama-cpp-python $(LLAMA_CPP) after the patches above it in patches/series"; exit 1; }; done && \
	  echo "patches/series: $(words $(PATCHES)) patches apply to a clean llama-cpp-python $(LLAMA_CPP) sdist"

# the series compiles for x86-64 without AVX-512 and for 64-bit ARM too (patches/check_portable.sh says how),
# checked once per set of patches and version of the check: a stamp in the cache records the pass
# (and the CUDA files for NVIDIA GPUs where nvcc is found, with the GPU check's candidate patches: gpu/candidates/)
CANDIDATES := $(wildcard gpu/candidates/*.patch)
PORTABLE_KEY := $(shell $(PYTHON) -c "import hashlib,sys;print(hashlib.sha256(b''.join(open(p,'rb').read() for p in sys.argv[1:])).hexdigest()[:12])" patches/check_portable.sh $(CANDIDATES))
PORTABLE := $(HOME)/.cache/localspec/patches-portable-$(PATCH_HASH)-$(PORTABLE_KEY)
patches-portable: $(SDIST)
	@test -e $(PORTABLE) || PYTHON=$(PYTHON) patches/check_portable.sh $(SDIST) $(PORTABLE) $(PATCHES) $(CANDIDATES)

# Before a patch change lands (minutes, not CI): the speed patches change no bit. A second venv gets a
# wheel with only the invariance patches; both builds write the logits of the same models (the real and demo
# pairs, a tiny model per weight type), rows alone and in batches of 1-17, and they must be equal.
BITS_VENV := .venv-invariance
patches-bits: install models
	$(MAKE) install VENV=$(BITS_VENV) PATCH_KIND=invariance
	$(BIN)/python patches/check_bits.py --against $(BITS_VENV)/bin/python

bench: install
	$(BIN)/localspec bench

# llama.cpp's own llama-server / llama-speculative-simple / llama-bench, built from the SAME vendored
# source, patches and flags as the wheel, so `localspec bench --llama-cpp` compares like with like.
TOOLS_DIR := $(HOME)/.cache/localspec/llama-cpp-tools-$(LLAMA_CPP)-$(WHEEL_KEY)
TOOLS     := llama-server llama-speculative-simple llama-bench

llama-cpp-tools: $(TOOLS_DIR)/bin/llama-server

$(TOOLS_DIR)/bin/llama-server: $(PATCHES)
	@echo "building llama.cpp's $(TOOLS) from llama-cpp-python $(LLAMA_CPP)'s vendored source (first time only, ~10 minutes)"
	@rm -rf $(TOOLS_DIR).tmp && mkdir -p $(TOOLS_DIR).tmp/src && \
	  $(PYTHON) -m pip download -q --no-deps --no-binary :all: --no-cache-dir -d $(TOOLS_DIR).tmp "llama-cpp-python==$(LLAMA_CPP)" && \
	  tar -xzf $(TOOLS_DIR).tmp/llama_cpp_python-$(LLAMA_CPP).tar.gz -C $(TOOLS_DIR).tmp/src --strip-components=1 && \
	  for p in $(abspath $(PATCHES)); do patch -s -p1 -d $(TOOLS_DIR).tmp/src < $$p || exit 1; done && \
	  cmake -S $(TOOLS_DIR).tmp/src/vendor/llama.cpp -B $(TOOLS_DIR).tmp/build -DCMAKE_BUILD_TYPE=Release \
	    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF $(strip $(CMAKE_FLAGS)) >$(TOOLS_DIR).tmp/cmake.log && \
	  cmake --build $(TOOLS_DIR).tmp/build -j $$(getconf _NPROCESSORS_ONLN) --target $(TOOLS) >$(TOOLS_DIR).tmp/build.log && \
	  mkdir -p $(TOOLS_DIR).new/bin && cp $(addprefix $(TOOLS_DIR).tmp/build/bin/,$(TOOLS)) $(TOOLS_DIR).new/bin/ && \
	  rm -rf $(TOOLS_DIR) $(TOOLS_DIR).tmp && mv $(TOOLS_DIR).new $(TOOLS_DIR)
	@echo "llama.cpp tools in $(TOOLS_DIR)/bin"

bench-llama-cpp: install llama-cpp-tools
	$(BIN)/localspec bench --llama-cpp $(TOOLS_DIR)/bin

doctor: install
	$(BIN)/localspec doctor

# the flags `make install` builds llama-cpp-python with here (gpu/check.sh builds with them on a GPU machine)
cmake-flags:
	@$(if $(CPU_ON_GPU),echo "note: $(CPU_ON_GPU)" >&2,true)
	@echo $(strip $(CMAKE_FLAGS))

# what the GPU check (gpu/check.sh, docs/gpu.md) carries to a lent GPU machine: .gpu/ and .gpu2/
gpu-pack: models
	gpu/pack.sh $(BIN)/python $(LLAMA_CPP)

clean:
	rm -rf $(VENV) build *.egg-info
