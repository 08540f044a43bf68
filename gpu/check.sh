#!/usr/bin/env bash
# The GPU check (docs/gpu.md says how to run it with the device tool, and what it found).
#
#   bash gpu/check.sh pack    whether .gpu/ holds the tree's patches and candidates (build checks it first): seconds
#   bash gpu/check.sh build   the CUDA wheel from .gpu/src.tar.gz (the Makefile's flags, sm_90), localspec installed
#                             beside it, then the load triage (below) while llama-bench, linked to the same
#                             libraries, compiles; random-weight models of real shapes are written meanwhile:
#                             about 6 minutes on 16 cores
#   bash gpu/check.sh ui      Gradio from .gpu3/ installed beside localspec, then `localspec ui` asked one reply
#                             through gradio_client (gpu/ui_probe.py): under a minute
#   bash gpu/check.sh run     every command on CUDA while llama-server compiles in the build tree, then
#                             `python -m localspec.bench gpu` (its report is saved after each stage, so a time
#                             limit leaves what was measured; llama-server's own modes beside localspec's), then the pair's
#                             target again with the CUDA patch's kernel choice undone (gpu-report-stock.md),
#                             and the draft and that target with the candidate patch's key undone
#                             (gpu-report-one-key.md; gpu/candidates/), then a target-only draw on this host's
#                             CPU, localspec's against llama.cpp's sampler chain, and a verification step
#                             decided from bounds of each row's total against every total computed, on real
#                             and random rows:
#                             about 3 minutes with REPEATS=3; the reports and logs land in $OUT
#
# The triage loads the draft the way localspec does (gpu/load_probe.py); where that crashes, cuda-gdb's backtrace
# of the crash lands in $OUT.
#
# Each stage keeps its work in $LOCALSPEC_GPU_WORK (default /tmp/lsgpu), which survives between two calls on
# a warm machine. CUDA_ARCH (default 90: H100, H200), SHAPES (default "1.5b 7b") and PAIR_SHAPE (7b) choose
# what is built and run; REPEATS (5) the decodes per row count, BENCH_TIMEOUT (300 s) the bench's limit. `run`
# uses the localspec of the working tree it is given. On a CPU, `run` works the same (a dry run).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${LOCALSPEC_GPU_WORK:-/tmp/lsgpu}
OUT=${OUT:-$WORK/out}
PY=${PYTHON:-python3}
SHAPES=${SHAPES:-"1.5b 7b"}
PAIR_SHAPE=${PAIR_SHAPE:-7b}  # the target of the end-to-end runs and of every command
mkdir -p "$WORK/site" "$OUT"
export PYTHONPATH=$WORK/site PATH=$WORK/site/bin:$PATH PYTHONUNBUFFERED=1
export LOCALSPEC_CACHE=$WORK/cache LOCALSPEC_MODELS=$WORK/models
MODELS=$WORK/randmodels
say() { echo "[$(date +%T)] $*" | tee -a "$OUT/check.log"; }

# the demo pair's file travels in two parts, .gpu/ with the first call and .gpu2/ with the second: each call keeps
# the part it carries in $WORK
keep_demo_parts() {
  for part in "$ROOT"/.gpu/demo.part1 "$ROOT"/.gpu2/demo.part2; do [ -f "$part" ] && cp "$part" "$WORK/"; done
}

# a stale pack would build and measure other patches than the tree's: refused before any device time goes into it
check_pack() {
  local packed wanted
  packed=$(cat "$ROOT/.gpu/patches.key" 2>/dev/null || echo none)
  wanted=$(bash "$ROOT/gpu/patches_key.sh")
  if [ "$packed" != "$wanted" ]; then
    say "the pack in .gpu/ was made from other patches (key $packed, the tree's $wanted): run \`make gpu-pack\` and carry .gpu again"
    return 1
  fi
  say "the pack in .gpu/ holds the tree's patches and candidates (key $wanted)"
}

build() {
  check_pack || return 1
  keep_demo_parts
  rm -rf "$WORK/src" && tar -xzf "$ROOT/.gpu/src.tar.gz" -C "$WORK"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$ROOT"/.gpu/wheels/*.whl
  gunzip -c "$ROOT/.gpu/template.gguf.gz" > "$WORK/template.gguf"

  say "writing random-weight models (${SHAPES}, the 0.5B draft) while the wheel compiles"
  mkdir -p "$MODELS"
  export GGUF_PY=$WORK/src/vendor/llama.cpp/gguf-py
  PYTHONPATH=$GGUF_PY "$PY" "$ROOT/gpu/randgguf.py" "$WORK/template.gguf" "$MODELS/0.5b-q4_0.gguf" --shape 0.5b \
    --qtype Q4_0 --pure > "$OUT/models-draft.log" 2>&1 &
  draft=$!
  (for shape in $SHAPES; do
     PYTHONPATH=$GGUF_PY "$PY" "$ROOT/gpu/randgguf.py" "$WORK/template.gguf" "$MODELS/$shape-q4_k_m.gguf" --shape "$shape"
   done) > "$OUT/models.log" 2>&1 &
  models=$!

  # what `make install` builds with on this machine (CUDA found), for this GPU's architecture only
  flags="$(make -s -C "$ROOT" cmake-flags PYTHON="$PY") -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DLLAVA_BUILD=OFF"
  say "building llama-cpp-python with CMAKE_ARGS='$flags'"
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip wheel -q --no-build-isolation --no-index \
    --no-deps -C build-dir="$WORK/build" -w "$WORK/wheel" "$WORK/src" > "$OUT/build.log" 2>&1 \
    || { say "wheel build FAILED"; tail -30 "$OUT/build.log"; return 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" "$WORK"/wheel/*.whl
  say "wheel built: $(ls "$WORK"/wheel)"
  # the record `make install` writes, so localspec knows the build's patches and flags
  patches=$(cd "$ROOT/patches" && LC_ALL=C ls llama-cpp-python-*.patch | tr '\n' ' ')
  printf '{"wheel": "%s", "cmake_args": "%s", "patches": "%s", "patch_hash": "%s"}\n' "$(ls "$WORK"/wheel)" "$flags" \
    "${patches% }" "$(cat "$ROOT"/patches/llama-cpp-python-*.patch | sha256sum | cut -c1-12)" \
    > "$("$PY" -c 'import sys; print(sys.prefix)')/localspec-llama-build.json"
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$WORK/site" "$ROOT" \
    > "$OUT/install.log" 2>&1 || { say "localspec install FAILED"; tail -20 "$OUT/install.log"; }

  say "llama-bench from the same build tree, while the load triage runs"
  (cmake -S "$WORK/src" -B "$WORK/build" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF \
     && cmake --build "$WORK/build" --target llama-bench -j "$(nproc)") > "$OUT/llama-bench-build.log" 2>&1 &
  bench=$!
  wait "$draft" || say "draft writing FAILED (see models-draft.log)"
  triage
  wait "$bench" || say "llama-bench build FAILED (see llama-bench-build.log)"
  wait "$models" || say "model writing FAILED (see models.log)"
  ls -la "$MODELS" | tee -a "$OUT/check.log"
  say "build done"
}

# localspec's own load of the draft; where it crashes, cuda-gdb names the native frame (docs/gpu.md: the crash
# at load was a C++ runtime the device's compiler linked into each library, found this way)
triage() {
  timeout 120 "$PY" -X faulthandler "$ROOT/gpu/load_probe.py" "$MODELS/0.5b-q4_0.gguf" > "$OUT/load-probe.log" 2>&1
  local rc=$?
  say "load probe: exit $rc — $(tail -1 "$OUT/load-probe.log")"
  if [ $rc -ne 0 ] && command -v cuda-gdb > /dev/null; then
    timeout 120 cuda-gdb -batch -ex run -ex 'thread apply all bt 25' \
      --args "$PY" "$ROOT/gpu/load_probe.py" "$MODELS/0.5b-q4_0.gguf" > "$OUT/crash-backtrace.log" 2>&1
    say "cuda-gdb: $(grep -m1 -A3 'received signal' "$OUT/crash-backtrace.log" | tr '\n' ' ')"
  fi
}

ui_probe() {  # the chat UI on the pair, driven as the page drives it; its line joins the next run's report
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" "$ROOT"/.gpu3/wheels/*.whl
  export PYTHONPATH=$ROOT:$PYTHONPATH
  say "\$ python3 gpu/ui_probe.py $PAIR_SHAPE-q4_k_m.gguf 0.5b-q4_0.gguf"
  timeout 240 "$PY" "$ROOT/gpu/ui_probe.py" "$MODELS/$PAIR_SHAPE-q4_k_m.gguf" "$MODELS/0.5b-q4_0.gguf" \
    > "$OUT/ui-probe.log" 2>&1
  say "exit $? — $(tail -1 "$OUT/ui-probe.log")"
  grep -E '\] \$ |\] exit ' "$OUT/check.log" | tail -2 > "$WORK/ui-probe.txt"
}

commands() {  # every command, each started as `$@` (localspec)
  local target=$MODELS/$PAIR_SHAPE-q4_k_m.gguf draft=$MODELS/0.5b-q4_0.gguf log=$OUT/commands.log
  run() { say "\$ $*"; timeout 120 "$@" >> "$log" 2>&1; say "exit $?"; }
  : > "$log"
  run "$@" doctor --target "$target" --draft "$draft"
  run "$@" doctor --target "$target" --draft "$draft" --n-gpu-layers 10
  run "$@" generate --target "$target" --draft "$draft" --max-tokens 32 --temperature 0 "def quicksort(items):"
  run "$@" generate --target "$target" --draft "$draft" --max-tokens 32 --n-gpu-layers 10 "Hello"
  printf 'Write a haiku about GPUs.\n/quit\n' > "$WORK/chat-input.txt"
  run bash -c "$* chat --target '$target' --draft '$draft' --no-color --max-tokens 32 < '$WORK/chat-input.txt'"
  run "$PY" "$ROOT/gpu/serve_probe.py" "$target" "$draft"
}

run_all() {
  export PYTHONPATH=$ROOT:$PYTHONPATH  # the working tree's localspec, which may be newer than the installed one
  keep_demo_parts
  if [ -f "$WORK/demo.part1" ] && [ -f "$WORK/demo.part2" ]; then
    mkdir -p "$LOCALSPEC_MODELS" && cat "$WORK/demo.part1" "$WORK/demo.part2" > "$LOCALSPEC_MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
    timeout 300 localspec models prepare --pair demo >> "$OUT/check.log" 2>&1 || say "demo pair not prepared"
  fi
  local server_build=""
  if [ -d "$WORK/build" ] && [ ! -x "$WORK/build/bin/llama-server" ]; then
    say "llama-server from the same build tree, while the commands run"
    (cmake -S "$WORK/src" -B "$WORK/build" -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
       && cmake --build "$WORK/build" --target llama-server -j "$(nproc)") > "$OUT/llama-server-build.log" 2>&1 &
    server_build=$!
  fi
  commands localspec
  if [ -n "$server_build" ]; then wait "$server_build" || say "llama-server build FAILED (see llama-server-build.log)"; fi
  local args=(--repeats "${REPEATS:-5}" --model "draft-0.5B=$MODELS/0.5b-q4_0.gguf")
  for shape in $SHAPES; do args+=(--model "target-${shape^^}=$MODELS/$shape-q4_k_m.gguf"); done
  args+=(--pair "$MODELS/$PAIR_SHAPE-q4_k_m.gguf:$MODELS/0.5b-q4_0.gguf")
  [ -f "$LOCALSPEC_MODELS/SmolLM2-135M-Instruct.F32.gguf" ] && args+=(--pair demo)
  [ -x "$WORK/build/bin/llama-bench" ] && args+=(--llama-bench "$WORK/build/bin/llama-bench")
  [ -x "$WORK/build/bin/llama-server" ] && args+=(--llama-cpp "$WORK/build/bin")
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/nvidia-smi.txt" 2>&1
  say "measuring: ${args[*]}"
  timeout "${BENCH_TIMEOUT:-300}" "$PY" -m localspec.bench gpu "${args[@]}" --note "nvidia-smi: $(head -1 "$OUT/nvidia-smi.txt")" \
    --out "$OUT/gpu-report.md" >> "$OUT/check.log" 2>&1 || say "the report FAILED (see check.log)"
  # the CUDA patch's kernel choice undone on the same build: what its dispatch part costs and what it buys
  say "measuring the pair's target with LOCALSPEC_CUDA_STOCK_DISPATCH=1"
  LOCALSPEC_CUDA_STOCK_DISPATCH=1 timeout 150 "$PY" -m localspec.bench gpu --repeats "${REPEATS:-5}" \
    --model "target-${PAIR_SHAPE^^}=$MODELS/$PAIR_SHAPE-q4_k_m.gguf" --out "$OUT/gpu-report-stock.md" \
    --note "LOCALSPEC_CUDA_STOCK_DISPATCH=1: upstream's choice of kernels (the patch's warp count stays)" \
    >> "$OUT/check.log" 2>&1 || say "the stock-dispatch report FAILED (see check.log)"
  # the candidate patch's key undone (gpu/candidates/): the decode costs after another size, upstream's way
  say "measuring the draft and the pair's target with LOCALSPEC_CUDA_GRAPH_PER_SHAPE=0"
  LOCALSPEC_CUDA_GRAPH_PER_SHAPE=0 timeout 150 "$PY" -m localspec.bench gpu --repeats "${REPEATS:-5}" \
    --model "draft-0.5B=$MODELS/0.5b-q4_0.gguf" --model "target-${PAIR_SHAPE^^}=$MODELS/$PAIR_SHAPE-q4_k_m.gguf" \
    --out "$OUT/gpu-report-one-key.md" \
    --note "LOCALSPEC_CUDA_GRAPH_PER_SHAPE=0: one CUDA graph per address, upstream's key (the candidate patch off)" \
    >> "$OUT/check.log" 2>&1 || say "the one-key report FAILED (see check.log)"
  # a target-only draw on this host's CPU: the demo's real rows (the head) and the pair's random ones (flat: the blocks)
  say "timing a target-only draw on this host, localspec's against llama.cpp's sampler chain"
  { printf '\n## A target-only draw on this host\n\n'
    for model in "$LOCALSPEC_MODELS/SmolLM2-135M-Instruct.F32.gguf" "$MODELS/$PAIR_SHAPE-q4_k_m.gguf"; do
      [ -f "$model" ] || continue
      printf '`python -m localspec.bench sampler --against-llama-cpp %s --repeats 20 --rows 30 -t 0 -t 0.7 -t 1`\n\n' "${model##*/}"
      timeout 120 "$PY" -m localspec.bench sampler --against-llama-cpp "$model" --repeats 20 --rows 30 -t 0 -t 0.7 -t 1 \
        2>> "$OUT/check.log" || say "the sampler bench FAILED on ${model##*/} (see check.log)"
      echo
      timeout 120 "$PY" -m localspec.bench sampler --verify-rows "$model" --rows 100 \
        2>> "$OUT/check.log" || say "the verification bench FAILED on ${model##*/} (see check.log)"
      echo
    done; } >> "$OUT/gpu-report.md"
  { printf '\n## The load triage and every command (gpu/check.sh)\n\n'
    grep -E 'load probe|cuda-gdb|\] \$ |\] exit ' "$OUT/check.log" | sed 's/^/    /'
    [ -f "$WORK/ui-probe.txt" ] && sed 's/^/    /' "$WORK/ui-probe.txt"; } >> "$OUT/gpu-report.md"
  say "run done"
}

case ${1:-} in
  pack) check_pack ;;
  build) build ;;
  ui) ui_probe ;;
  run) run_all ;;
  *) echo "usage: bash gpu/check.sh pack|build|ui|run" >&2; exit 2 ;;
esac
