#!/usr/bin/env bash
# The key of what gpu/pack.sh applies to llama-cpp-python's source: patches/series, its patches and the candidates
# (gpu/candidates/), whole. pack.sh writes it into .gpu/; gpu/check.sh build compares it with the tree it is given
# and refuses a pack made from other patches, before any device time goes into building it.
set -euo pipefail
export LC_ALL=C  # the files in one order on every machine (a glob sorts by the locale)
shopt -s nullglob
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cat patches/series patches/*.patch gpu/candidates/*.patch | sha256sum | cut -c1-16
