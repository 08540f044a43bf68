#!/usr/bin/env bash
# The patch series compiles for the CPUs localspec's users build on, not only for the one at hand
# (make patches-portable, part of make test): ggml's CPU, base and RPC libraries, the only ones the
# patches touch, for
#   - x86-64 with AVX2 and without AVX-512 (most desktop and laptop CPUs), with and without AVX-VNNI
#     (Intel's since the 12th Core generation), where an x86 host builds; the AVX-512 paths are the
#     host's own build (make install);
#   - 64-bit ARM with dot products and FP16, with and without int8 matrix multiplies (the CPU backend of
#     Apple silicon, ARM servers), natively on an ARM host, else with the aarch64 cross compiler, which a
#     root shell with apt-get installs here.
# Each patch's x86 kernels sit behind the instruction sets they use; a kernel left unguarded breaks one
# of these builds, where the host's own build would not notice.
# usage: patches/check_portable.sh SDIST STAMP PATCH...   (STAMP is touched once every build passed)
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

arm() {  # arm HOW CMAKE_ARGS...: both ARM builds
    local how=$1
    shift
    build "64-bit ARM with int8 matrix multiplies$how" -DGGML_CPU_ARM_ARCH=armv8.6-a+dotprod+fp16+i8mm "$@"
    build "64-bit ARM without int8 matrix multiplies$how" -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16 "$@"
}

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
mkdir -p "$(dirname "$stamp")"
touch "$stamp"
