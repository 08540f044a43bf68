"""The doctor's measurement and diagnosis, on toy models whose batch behaviour is known (no llama.cpp).

A real build of localspec is batch-invariant, so the cases the doctor must
explain — repacked kernels that round differently, flash attention, both,
nothing that helps — are built here from a toy model that perturbs the rows
of a batch whenever a given load setting is on.
"""

from __future__ import annotations

import numpy as np
import pytest

from localspec.app.invariance import (
    PROBE_SIZES,
    diagnose,
    measure_batch_invariance,
    probe_sizes,
    probe_tokens,
    within_invariant_rows,
)
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams

from .toy import ToyLM


class BatchSensitiveLM(ToyLM):
    """A toy whose logits for rows of a multi-row batch move by 1e-3 while any setting in ``breaks`` is on."""

    def __init__(self, settings: dict[str, bool], breaks: set[str], min_rows: int = 2) -> None:
        super().__init__(vocab_size=8, seed=3, context_size=1024, name="toy.gguf")
        self.settings, self.breaks, self.min_rows = settings, breaks, min_rows
        self.closed = False

    def extend(self, tokens, n_logits, borrow=False):
        rows = super().extend(tokens, n_logits)
        if len(tokens) >= self.min_rows and any(self.settings.get(name, False) for name in self.breaks):
            rows = rows + np.float32(1e-3)
        return rows

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [ord(c) % 8 for c in text]

    def close(self) -> None:
        self.closed = True


def loader(current: dict[str, bool], breaks: set[str], loaded: list):
    def load(overrides: dict[str, bool]):
        model = BatchSensitiveLM({**current, **overrides}, breaks)
        loaded.append(model)
        return model

    return load


def report_for(settings: dict[str, bool], breaks: set[str], min_rows: int = 2):
    model = BatchSensitiveLM(settings, breaks, min_rows)
    return measure_batch_invariance(model, probe_tokens(model.tokenize))


UNPATCHED = {
    "weight_type": "qwen2 1.5B Q4_K - Medium",
    "buffers": "CPU_REPACK",
    "patched": "no",
    "llamafile": "off",
    "tiled": "off",
}


def test_measurement_sees_a_difference_in_any_batch_size_class() -> None:
    assert report_for({"extra_buffers": True}, set()).identical  # negative control: nothing breaks it
    for min_rows in PROBE_SIZES:  # a kernel that switches only at this many rows is still caught
        report = report_for({"extra_buffers": True}, {"extra_buffers"}, min_rows)
        assert not report.identical and report.max_abs_diff == pytest.approx(1e-3, rel=1e-3), min_rows


def test_where_kernels_bound_invariance_the_probe_stops_at_the_bound() -> None:
    """On CUDA (``invariant_rows`` 8) a batch of 9 or more rows switches kernels and localspec never verifies
    one in greedy or invariant mode: the probe covers every size class up to the bound, the bound itself too."""
    bounded = BatchSensitiveLM({}, set())
    assert probe_sizes(bounded) == PROBE_SIZES  # no bound: every class
    bounded.invariant_rows = 8
    assert probe_sizes(bounded) == (2, 3, 5, 8)
    bounded.settings, bounded.breaks = {"gpu": True}, {"gpu"}
    for min_rows in (2, 8):  # the bound is probed, so a switch at exactly 8 rows is caught
        bounded.min_rows = min_rows
        assert not measure_batch_invariance(bounded, probe_tokens(bounded.tokenize)).identical, min_rows
    bounded.min_rows = 9  # past the bound: not localspec's batch, and not reported
    assert measure_batch_invariance(bounded, probe_tokens(bounded.tokenize)).identical


class LongBatchSensitiveLM(BatchSensitiveLM):
    """A toy whose long batches (a prompt's) round by their length, as llama.cpp's MMQ kernels split their work
    on CUDA; verification batches are untouched."""

    def extend(self, tokens, n_logits, borrow=False):
        rows = super().extend(tokens, n_logits)
        return rows + np.float32(1e-6 * len(tokens)) if len(tokens) >= 64 else rows


def test_a_prompt_that_depends_on_its_chunks_is_reported_apart_from_the_verdict() -> None:
    """Greedy and speculative replies continue the same cache, so a prompt evaluated whole or in two chunks is
    not part of the promise; the doctor still says what was cached can change a reply."""
    model = LongBatchSensitiveLM({}, set())
    report = measure_batch_invariance(model, probe_tokens(model.tokenize))
    assert report.identical and report.prompt_split_diff > 0
    assert "what was cached can change a reply" in report.line()
    control = report_for({"extra_buffers": True}, set())  # nothing perturbed: no note
    assert control.identical and control.prompt_split_diff == 0 and "cached" not in control.line()


@pytest.mark.parametrize(
    ("mode", "temperature", "k", "limit", "expected_k", "expected_rows"),
    [
        ("greedy", 0.0, 8, 8, 7, 8),  # 8 drafts and the row before them: 9 rows, one too many
        ("invariant", 0.7, 16, 8, 7, 8),
        ("rejection", 0.0, 8, 8, 7, 8),  # T = 0 is greedy in any mode
        ("greedy", 0.0, 4, 8, 4, 8),  # K within the bound; lookup's copies still bounded
        ("rejection", 0.7, 16, 8, 16, 0),  # exact by rule, whatever the batch
        ("greedy", 0.0, 16, None, 16, 0),  # no bound (the CPU)
    ],
)
def test_a_mode_that_needs_invariance_verifies_within_the_bound(mode, temperature, k, limit, expected_k, expected_rows):
    options = GenerationOptions(mode=mode, draft_tokens=k, adaptive=True, min_draft_tokens=min(k, 8))
    bounded = within_invariant_rows(options, SamplingParams(temperature=temperature), limit)
    assert (bounded.draft_tokens, bounded.max_rows) == (expected_k, expected_rows)
    assert bounded.min_draft_tokens <= bounded.draft_tokens


def test_repacked_kernels_are_named_with_the_patched_build_as_the_fix() -> None:
    current = {"extra_buffers": True, "flash_attention": False}
    loaded: list = []
    report = report_for(current, {"extra_buffers"})
    found = diagnose(report, loader(current, {"extra_buffers"}, loaded), current, UNPATCHED)
    assert found.remedy == {"extra_buffers": False} and found.remedy_report.identical
    assert "repacked CPU kernels" in found.cause and "gemv" in found.cause and "Q4_K - Medium" in found.cause
    assert "`make install`" in found.fix and "patch" in found.fix
    assert all(model.closed for model in loaded)  # every trial model is freed
    patched = diagnose(report, loader(current, {"extra_buffers"}, []), current, {**UNPATCHED, "patched": "yes"})
    assert "LOCALSPEC_EXTRA_BUFFERS=0" in patched.fix and "make install" not in patched.fix


def test_flash_attention_and_both_together() -> None:
    current = {"extra_buffers": False, "flash_attention": True}
    found = diagnose(
        report_for(current, {"flash_attention"}), loader(current, {"flash_attention"}, []), current, UNPATCHED
    )
    assert found.remedy == {"flash_attention": False} and "flash attention" in found.cause
    assert "model.flash_attention: false" in found.fix
    both = {"extra_buffers": True, "flash_attention": True}
    loaded: list = []
    found = diagnose(report_for(both, set(both)), loader(both, set(both), loaded), both, UNPATCHED)
    assert found.remedy == {"extra_buffers": False, "flash_attention": False}
    assert "repacked" in found.cause and "flash attention" in found.cause
    assert len(loaded) == 3  # each suspect alone, then both


def test_when_nothing_helps_the_doctor_says_so_and_names_what_it_can() -> None:
    current = {"extra_buffers": True, "flash_attention": False}
    unfixable = {"something_else"}
    found = diagnose(report_for({"something_else": True}, unfixable), loader({"something_else": True}, unfixable, []),
                     current, UNPATCHED)  # fmt: skip
    assert found.remedy is None and found.cause.startswith("not found") and "extra buffers off" in found.cause
    tiled = diagnose(report_for({"something_else": True}, unfixable), loader({"something_else": True}, unfixable, []),
                     current, {**UNPATCHED, "tiled": "on"})  # fmt: skip
    assert "tiled K-quant matmul" in tiled.cause and "GGML_CPU_TILED_MM" in tiled.fix
    llamafile = diagnose(report_for({"something_else": True}, unfixable),
                         loader({"something_else": True}, unfixable, []),
                         current, {**UNPATCHED, "llamafile": "on"})  # fmt: skip
    assert "llamafile" in llamafile.cause and "make install" in llamafile.fix
    # an ARM build with int8 matrix multiplies pairs the rows of even batches, whatever the buffers: the cause
    # and a build without them are named (measured under emulation: docs/design.md, Batch invariance)
    arm = diagnose(report_for({"something_else": True}, unfixable), loader({"something_else": True}, unfixable, []),
                   current, {**UNPATCHED, "int8_matmul": "on"})  # fmt: skip
    assert "two rows at a time" in arm.cause and "armv8.2-a+dotprod+fp16" in arm.fix and arm.remedy is None
    assert "ARM" not in found.cause + found.fix  # the control: an x86 build is not told about ARM


def test_the_tiled_matmul_line_says_whether_it_is_safe() -> None:
    """On, the tiled matmul is safe only with localspec's K-quant patch in the build; the doctor tells the three
    states apart (off / on and patched / on without the patch, which breaks invariance)."""
    from localspec.cli.doctor import build_lines

    def line(tiled: bool, invariant: bool) -> str:
        build = {"version": "0.3.36", "system_info": "CPU : AVX2 = 1", "tiled_matmul": tiled,
                 "tiled_invariant": invariant, "patches": (), "stamp": {}}  # fmt: skip
        return next(text for text in build_lines(build) if text.startswith("tiled K-quant matmul"))

    assert "off" in line(False, True) and "off" in line(False, False)
    assert "on for Q4_K, Q5_K and Q6_K" in line(True, True)
    assert "round differently" in line(True, False) and "unset it" in line(True, False)
