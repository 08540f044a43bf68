#!/usr/bin/env bash
# `make gpu-pack`: what the GPU check needs on a machine that has no network, in .gpu/ and .gpu2/ (git-ignored),
# each under the 64 MiB a device call carries:
#   .gpu/src.tar.gz    llama-cpp-python's sdist with localspec's patches applied, stripped of what a CUDA
#                      build never reads (models, docs, tests, examples, the other backends): ~6 MB
#   .gpu/wheels/       the pure-Python packages localspec needs that the device image lacks (Python 3.12)
#   .gpu/patches.key   the key of the patches and candidates it applied (gpu/patches_key.sh)
#   .gpu/template.gguf.gz  the real 1.5B target's metadata (tokenizer, chat template) without its tensors
#   .gpu/demo.part1, .gpu2/demo.part2   the demo pair's Q4_1 file in two parts (real weights end to end)
#   .gpu3/wheels/      Gradio and what it needs beyond the above, at this venv's versions (the UI probe): ~33 MB
# Usage: gpu/pack.sh PYTHON LLAMA_CPP_VERSION (the Makefile passes both).
set -euo pipefail
PYTHON=${1:-python3}
VERSION=${2:-0.3.36}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACK=$ROOT/.gpu
PACK2=$ROOT/.gpu2
PACK3=$ROOT/.gpu3
MODELS=${LOCALSPEC_MODELS:-$HOME/.cache/localspec/models}
SDIST_CACHE=${LOCALSPEC_SDIST_CACHE:-$HOME/.cache/localspec/sdist}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

rm -rf "$PACK" "$PACK2" "$PACK3"
mkdir -p "$PACK/wheels" "$PACK2" "$PACK3/wheels" "$SDIST_CACHE"

sdist=$SDIST_CACHE/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$sdist" ]; then
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: --no-cache-dir -d "$SDIST_CACHE" "llama-cpp-python==$VERSION"
fi
mkdir -p "$WORK/src"
tar -xzf "$sdist" -C "$WORK/src" --strip-components=1
for patch in $(grep -v '^#' "$ROOT/patches/series"); do  # in the series' order, as `make install` applies them
  patch -s -p1 -d "$WORK/src" < "$ROOT/patches/$patch"
done
for patch in "$ROOT"/gpu/candidates/*.patch; do  # candidates the GPU check measures both ways (each has a switch)
  [ -f "$patch" ] && patch -s -p1 -d "$WORK/src" < "$patch"
done
llama=$WORK/src/vendor/llama.cpp
rm -rf "$WORK"/src/{.git,.github,docker,docs,examples,tests}
rm -rf "$llama"/{models,docs,media,benches,tests,examples}
# llama-server (built on the device to time llama.cpp's own modes) needs tools/server, tools/cli and tools/ui's CMake
# files; it builds without the web UI's sources (llama.cpp's fallback: no embedded UI)
rm -rf "$llama"/tools/server/{tests,bench} "$llama"/tools/ui/{src,static,tests,package-lock.json}
for backend in "$llama"/ggml/src/ggml-*/; do
  case $(basename "$backend") in ggml-cpu|ggml-cuda|ggml-blas|ggml-rpc) ;; *) rm -rf "$backend" ;; esac
done
tar -czf "$PACK/src.tar.gz" -C "$WORK" src
bash "$ROOT/gpu/patches_key.sh" > "$PACK/patches.key"  # gpu/check.sh build refuses a pack of other patches

"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$PACK/wheels" diskcache prompt_toolkit wcwidth fastapi starlette uvicorn pydantic pydantic_core \
  annotated_types typing_inspection opentelemetry_api pyelftools

pinned=$("$PYTHON" -c 'import importlib.metadata as m, sys; print(" ".join(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' \
  gradio gradio_client brotli groovy hf-gradio orjson pydub python-multipart pytz safehttpx semantic-version tomlkit)
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$PACK3/wheels" $pinned

PYTHONPATH=$llama/gguf-py "$PYTHON" "$ROOT/gpu/make_template.py" \
  "$MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" "$WORK/template.gguf" >/dev/null
gzip -c "$WORK/template.gguf" > "$PACK/template.gguf.gz"

demo=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf  # 94 MiB: 40 with the first call, the rest with the second
first=$((40 << 20))
head -c "$first" "$demo" > "$PACK/demo.part1"
tail -c +"$((first + 1))" "$demo" > "$PACK2/demo.part2"
du -sh "$PACK" "$PACK2" "$PACK3"
