#!/usr/bin/env bash
# The key of what gpu/pack.sh applies to llama-cpp-python's source: patches/series, its patches and the candidates
# (gpu/candidates/), whole. pack.sh writes it into .gpu/; gpu/check.sh build compares it with the tree it is given
# and refuses a pack made from other patches, before any device time goes into building it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LC_ALL=C cat patches/series patches/*.patch gpu/candidates/*.patch 2>/dev/null | sha256sum | cut -c1-16
