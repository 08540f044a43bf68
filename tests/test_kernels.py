"""Every weight type localspec's patches touch gives a row the same bits alone and inside a batch of 1-17 rows.

A tiny model per type (localspec/llama/tinymodels.py: two layers, 256 wide, random weights, every
matrix in that one type) is loaded with localspec's own weight placement, so each type runs the kernels
a real model of it would: the repacked gemv and gemm (Q4_0, Q4_K), the tiled K-quant matmul from 8 rows
(Q4_K, Q5_K, Q6_K outside the repacked buffer), the multi-row vec_dot (K-quants, Q5_0), the one-row
vec_dot (all). A batch of each size, after 16 cached tokens, must equal the same tokens decoded one at
a time, bit for bit (docs/design.md, Batch invariance). Stock llama.cpp's tiled matmul differed by
0.38-0.59 on real models; no stock build is at hand here, so the negative control shows the comparison
sees a one-ulp difference in one logit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.app.invariance import _diff, row_count_diffs
from localspec.llama.model import LlamaModel, LlamaSettings
from localspec.llama.tinymodels import TYPES, matrix_types, tiny_models

from .conftest import TARGET, TEST_THREADS, require

pytestmark = [pytest.mark.models, pytest.mark.xdist_group("kernels")]

SIZES = range(1, 18)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    require(TARGET)  # the demo target, for its tokenizer only
    return tiny_models(TARGET, tmp_path_factory.mktemp("kernels"))


@pytest.mark.parametrize("kind", TYPES)
def test_every_row_of_a_batch_of_1_to_17_equals_the_row_alone(models, kind: str) -> None:
    path = models[kind]
    assert matrix_types(path) == {kind}, "the tiny model must hold every matrix in the type under test"
    model = LlamaModel(path, LlamaSettings(n_ctx=512, threads=TEST_THREADS))
    try:
        tokens = model.tokenize("The patches must not change a single bit of any row. " * 8)
        assert len(tokens) >= 16 + max(SIZES) + 1
        diffs = row_count_diffs(model, tokens, SIZES)
    finally:
        model.close()
    assert diffs == {size: 0.0 for size in SIZES}, f"{kind} on {model.weight_buffers}: rows that differ {diffs}"


def test_the_comparison_sees_a_row_that_differs_in_one_bit() -> None:
    """Negative control for the check above: one ulp in one logit of one row is a difference."""
    alone = np.random.default_rng(1).standard_normal((5, 100)).astype(np.float32)
    batched = alone.copy()
    assert _diff(alone, batched) == 0.0
    batched[3, 17] = np.nextafter(batched[3, 17], np.float32(np.inf))
    assert _diff(alone, batched) > 0.0
