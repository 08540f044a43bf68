#!/usr/bin/env bash
# The patch series compiles for the CPUs and GPUs localspec's users build on, not only for the machine at
# hand (make patches-portable, part of make test): ggml's CPU, base and RPC libraries for
#   - x86-64 with AVX2 and without AVX-512 (most desktop and laptop CPUs), with and without AVX-VNNI
#     (Intel's since the 12th Core generation), where an x86 host builds; the AVX-512 paths are the
#     host's own build (make install);
#   - 64-bit ARM with dot products and FP16, with and without int8 matrix multiplies (the CPU backend of
#     Apple silicon, ARM servers), natively on an ARM host, else with the aarch64 cross compiler, which a
#     root shell with apt-get installs here;
#   - NVIDIA GPUs, where this machine has nvcc (on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin): the CUDA
#     files the patches touch, compiled for Ampere, Hopper and Blackwell (sm_86, sm_90, sm_120) with no GPU
#     needed. cuBLAS's headers come from the toolkit, else from PyPI's nvidia-cublas wheel of nvcc's major
#     version (downloaded once; its headers are kept in $CUBLAS_HEADERS, ~/.cache/localspec/cublas-<major>).
# Each patch's x86 kernels sit behind the instruction sets they use; a kernel left unguarded breaks one
# of these builds, where the host's own build would not notice; a CUDA patch that does not compile would
# cost a lent GPU's build.
# usage: patches/check_portable.sh SDIST STAMP PATCH...   (STAMP is touched once every build passed;
# PYTHON, default python3, downloads cuBLAS's headers)
set -euo pipefail
sdist=$1 stamp=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
tar -xzf "$sdist" -C "$work/src" --strip-components=1
for patch in "$@"; do patch -s -p1 -d "$work/src" < "$patch"; done
jobs=$(getconf _NPROCESSORS_ONLN)

builds=0
build() {  # build NAME CMAKE_ARGS...: configure and compile the patched libraries, or show why not
    local name=$1 dir
    shift
    builds=$((builds + 1))
    dir=$work/build-$builds  # a path without spaces: the build folder goes into the libraries' rpaths
    if ! cmake -S "$work/src/vendor/llama.cpp" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DGGML_LLAMAFILE=OFF \
        -DGGML_RPC=ON "$@" > "$dir.log" 2>&1 ||
       ! cmake --build "$dir" -j "$jobs" --target ggml-base ggml-cpu ggml-rpc >> "$dir.log" 2>&1; then
        grep -E -m 20 "error|Error" "$dir.log" || tail -20 "$dir.log"
        echo "patches/series does not compile for $name (the errors above)"
        exit 1
    fi
    echo "patches/series compiles for $name"
}

cuda() {  # the .cu files the patches touch (ggml-cuda.cu where they touch only headers), for three architectures
    local nvcc headers major dir objects
    nvcc=$(command -v nvcc || ls "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc 2> /dev/null | head -1 || true)
    if [ -z "$nvcc" ]; then
        echo "NVIDIA GPUs: not checked (no nvcc on PATH, in \$CUDA_HOME/bin or /usr/local/cuda/bin)"
        return
    fi
    major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    headers=$(dirname "$(dirname "$nvcc")")/include
    if [ ! -f "$headers/cublas_v2.h" ]; then
        headers=${CUBLAS_HEADERS:-$HOME/.cache/localspec/cublas-$major}/include
        if [ ! -f "$headers/cublas_v2.h" ] && ! cublas_headers "$major" "$(dirname "$headers")"; then
            echo "NVIDIA GPUs: not checked (no cuBLAS headers for CUDA $major: pip could not download nvidia-cublas)"
            retry=1  # no stamp: the next run tries again
            return
        fi
    fi
    # compile-only: cuBLAS and the driver as header-only targets (nothing is linked)
    printf 'foreach(lib cublas cublasLt cuda_driver)\n  if(NOT TARGET CUDA::${lib})\n    add_library(CUDA::${lib} INTERFACE IMPORTED GLOBAL)\n    set_target_properties(CUDA::${lib} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES %s)\n  endif()\nendforeach()\n' \
        "$headers" > "$work/cuda-headers.cmake"
    builds=$((builds + 1))
    dir=$work/build-$builds
    objects=$(cat "$@" | sed -n 's|^+++ b/vendor/llama.cpp/ggml/src/ggml-cuda/\([^/[:space:]]*\.cu\)\([[:space:]].*\)*$|\1.o|p' | sort -u)
    if ! cmake -S "$work/src/vendor/llama.cpp" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DGGML_LLAMAFILE=OFF -DGGML_RPC=ON -DGGML_CUDA=on -DCMAKE_CUDA_COMPILER="$nvcc" \
        -DCMAKE_CUDA_ARCHITECTURES="86;90;120" -DCMAKE_PROJECT_INCLUDE="$work/cuda-headers.cmake" > "$dir.log" 2>&1 ||
       ! make -C "$dir/ggml/src/ggml-cuda" -j "$jobs" ${objects:-ggml-cuda.cu.o} >> "$dir.log" 2>&1; then
        grep -E -m 20 "error|Error" "$dir.log" || tail -20 "$dir.log"
        echo "patches/series does not compile for NVIDIA GPUs with CUDA $major (the errors above)"
        exit 1
    fi
    echo "patches/series compiles for NVIDIA GPUs (CUDA $major, sm_86, sm_90, sm_120): $(echo ${objects:-ggml-cuda.cu.o})"
}

cublas_headers() {  # cublas_headers MAJOR FOLDER: cuBLAS's headers from its PyPI wheel into FOLDER/include
    local name=nvidia-cublas
    [ "$1" -le 12 ] && name=nvidia-cublas-cu$1
    mkdir -p "$work/cublas" "$2" &&
        "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
            --platform manylinux_2_5_x86_64 -d "$work/cublas" "$name>=$1,<$(($1 + 1))" > /dev/null 2>&1 &&
        "${PYTHON:-python3}" - "$work/cublas" "$2" <<'PY'
import pathlib, sys, zipfile
wheel, = pathlib.Path(sys.argv[1]).glob("*.whl")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/include/" in name and not name.endswith("/"):
            target = pathlib.Path(sys.argv[2], "include", name.split("/include/", 1)[1])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
PY
    rm -rf "$work/cublas"
    [ -f "$2/include/cublas_v2.h" ]
}

arm() {  # arm HOW CMAKE_ARGS...: both ARM builds
    local how=$1
    shift
    build "64-bit ARM with int8 matrix multiplies$how" -DGGML_CPU_ARM_ARCH=armv8.6-a+dotprod+fp16+i8mm "$@"
    build "64-bit ARM without int8 matrix multiplies$how" -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16 "$@"
}

cuda "$@"
case $(uname -m) in
    x86_64 | amd64)
        build "x86-64 with AVX2, without AVX-512" -DGGML_AVX512=OFF
        build "x86-64 with AVX2 and AVX-VNNI, without AVX-512" -DGGML_AVX512=OFF -DGGML_AVX_VNNI=ON
        if ! command -v aarch64-linux-gnu-g++ > /dev/null && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            echo "installing the aarch64 cross compiler (g++-aarch64-linux-gnu) for the ARM build"
            { apt-get update -qq && apt-get install -y -qq g++-aarch64-linux-gnu; } > /dev/null 2>&1 || true
        fi
        if command -v aarch64-linux-gnu-g++ > /dev/null; then
            arm " (cross-compiled)" -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
                -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
        else
            echo "64-bit ARM: not checked (no aarch64 cross compiler: apt-get install g++-aarch64-linux-gnu)"
            exit 0  # no stamp: the next run tries again
        fi
        ;;
    arm64 | aarch64)
        arm ""
        ;;
    *)
        build "$(uname -m)"
        ;;
esac
[ -z "${retry:-}" ] || exit 0
mkdir -p "$(dirname "$stamp")"
touch "$stamp"
