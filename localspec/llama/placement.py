"""Where a model's weights go: llama.cpp's extra (AMX / repacked) CPU buffers or plain memory."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

from localspec.llama.runtime import (
    amx_rows_without_tiles,
    amx_streamed_rows,
    cpu_extra_buffer_types,
    extra_buffers_choice,
    gguf_tensor_table,
    system_info,
)

REPACK = "CPU_REPACK"
# The x86 repack kernels (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type) take these types
# in blocks of 8 weight rows; a tensor of any other type placed in the repack buffer aborts the load.
REPACKED_TYPES = ("Q4_0", "Q4_K")
# Only matrices that are multiplied: the token embeddings are looked up by row (GET_ROWS), which the
# repack buffer cannot do.
MATMUL_WEIGHT = re.compile(r"^(blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))|output)\.weight$")


@dataclass(frozen=True)
class WeightPlacement:
    """Whether a model may use llama.cpp's extra CPU buffer types, and whether each token needs its own decode.

    ``one_row_per_decode`` is only acted on where the AMX buffer really holds
    weights (see :func:`weight_placement`); ``repack_only`` puts the matrices
    llama.cpp can repack in its repacked buffer while ``extra_buffers`` is off
    (so no AMX); ``reason`` is what the doctor shows.
    """

    extra_buffers: bool
    one_row_per_decode: bool
    reason: str
    repack_only: bool = False


def weight_placement(role: str, path: Path | str) -> WeightPlacement:
    """Where ``role``'s weights go: AMX/repacked extra buffers or plain CPU memory.

    A build compiled with AMX (``-march=native`` on a Sapphire-Rapids-class
    CPU) puts quantized weights (Q4_0/Q4_1/Q8_0/K-quants) in an AMX buffer.
    Batches of two or more rows then run AMX tile instructions, which die with
    SIGILL (``tileloadd``) on VMs that advertise AMX but do not enable its tile
    state (measured here: Firecracker guests). Batches of one row take a
    separate AVX512-VNNI path with no tiles. So on AMX builds a model either
    keeps the AMX buffer and is fed **one row per decode**, or loads without it
    — with its Q4_0/Q4_K matrices still in llama.cpp's repacked buffer (what
    non-AMX builds use), whose kernels need no tiles:

    * the **target** takes it only where localspec's streamed-rows patch
      (``patches/…speed-amx-streamed-rows.patch``) has kernels for nearly all
      its matrices (``STREAMED_TYPES``; ``AMX_SHARE``): batches there unpack each
      weight block once for up to 4 rows, and weights stream in order with a
      prefetch. The real pair's 1.5B Q4_K_M target then decodes 1 / 2 / 3 / 4 / 8
      rows in 46-48 / 54 / 60 / 64 / 96 ms, against 66 / 67 / 71 / 80 / 139
      repacked (Sapphire Rapids VM, two cores); without the patch, batches ran
      the one-row kernel once per row (2 rows 80 ms, 4 rows 106), and it took the
      repacked buffer: 65 ms a token instead of 95 in plain memory, 2 rows in 59
      ms instead of 106.
    * the **draft** takes it only where AMX would hold nearly all its weights
      (``AMX_SHARE``): SmolLM2 Q4_1 / Q4_0 then decode a token in
      7.2 / 7.6 ms instead of 9.6 / 9.4 (two rows: 14.1 / 14.0 instead of
      12.6 / 11.6, prompts 1.3-1.8x slower). Qwen2.5-0.5B Q4_K_M is 55 % Q5_0,
      which AMX does not take: one row 24.5 ms against 26.6, but a two-row
      catch-up 45.7 against 32.9 and a 300-token prompt 5.0 s against 1.7.
      Requantized to Q4_0 (the default pair's draft) AMX holds all of it:
      16.3 ms a token against 20.9 repacked, which paid more in the bench
      than its slower prompt (2.7 s against 1.2) cost.

    localspec's AMX patch (``patches/…speed-amx-rows-without-tiles.patch``) lifts the one-row rule: it
    runs a batch's rows on the one-row kernels, each block of weights read once for all rows, so a draft
    in the AMX buffer reads a prompt or a two-token catch-up in one decode (the Q4_0 0.5B: 2 rows in
    17.6-18.0 ms against 24.2-25.3, a 300-token prompt in 0.83-0.85 s against 2.6-2.7).

    ``LOCALSPEC_EXTRA_BUFFERS=1`` says AMX tiles work here (normal batches,
    extra buffers for both); ``=0`` turns extra buffers off for both.
    """
    value = extra_buffers_choice()
    if value == "1":
        return WeightPlacement(True, False, "extra buffers on (LOCALSPEC_EXTRA_BUFFERS=1)")
    if value == "0":
        return WeightPlacement(False, False, "extra buffers off (LOCALSPEC_EXTRA_BUFFERS=0)")
    if "AMX_INT8 = 1" not in system_info():
        return WeightPlacement(True, False, "extra buffers on (no AMX in this build)")
    share = amx_share(path)
    streamed = _streamed(path)
    if role == "target" and streamed:
        return WeightPlacement(True, False, f"AMX build: AMX buffer ({share:.0%} of the weights), batches streamed, "
                               "up to 4 rows per pass on its one-row kernels (no tile instructions)")  # fmt: skip
    if role == "draft" and share >= AMX_SHARE:
        if amx_rows_without_tiles():
            how = "streamed, up to 4 rows per pass" if streamed else "row by row"
            return WeightPlacement(True, False, f"AMX build: AMX buffer ({share:.0%} of the weights), batches {how} "
                                   "on its one-row kernels (no tile instructions)")  # fmt: skip
        return WeightPlacement(True, True, f"AMX build: AMX buffer ({share:.0%} of the weights), one row per decode (no tile instructions)")
    return WeightPlacement(
        False, False, f"AMX build: no AMX buffer ({share:.0%} of the weights would go there; batches would run "
        "AMX tiles), Q4_0/Q4_K matrices repacked", repack_only=True,
    )


def _streamed(path: Path | str) -> bool:
    """Whether the build's streamed-rows kernels cover nearly all of the model's matrices (by bytes)."""
    return amx_streamed_rows() and amx_share(path, STREAMED_TYPES) >= AMX_SHARE


def llama_cpp_default_runs() -> bool:
    """Whether llama.cpp's own default placement (every extra buffer type, AMX's included) runs here, so
    its tools can be timed as they run by default: not where the user turned extra buffers off
    (``LOCALSPEC_EXTRA_BUFFERS=0``, and then like for like), and on AMX builds only where tiles work or
    batches in the AMX buffer skip them (localspec's AMX patch, whose ``GGML_AMX_NO_TILES`` the tools
    inherit from this process). Timed with ``--no-repack`` instead, the real pair's target alone ran at
    9.9 tok/s in llama-server on the AMX VM, against 14.6 in its default placement."""
    choice = extra_buffers_choice()
    if choice in ("0", "1"):
        return choice == "1"
    return "AMX_INT8 = 1" not in system_info() or amx_rows_without_tiles()


AMX_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")  # ggml-cpu/amx/common.h, qtype_has_amx_kernels
AMX_SHARE = 0.9  # share of a model's matrix bytes the AMX buffer (a target: its streamed kernels) must hold to get it (see above)
STREAMED_TYPES = ("Q4_0", "Q4_K", "Q6_K")  # the types with batch kernels in localspec's streamed-rows patch


def amx_share(path: Path | str, types: tuple[str, ...] = AMX_TYPES) -> float:
    """The share of the model's multiplied matrices (by bytes) in ``types`` (by default, those llama.cpp's
    AMX buffer takes)."""
    matrices = [(kind, size) for name, kind, _, _, size in gguf_tensor_table(str(path)) if MATMUL_WEIGHT.match(name)]
    total = sum(size for _, size in matrices)
    return sum(size for kind, size in matrices if kind in types) / total if total else 0.0


class TensorOverride(ctypes.Structure):
    """llama.cpp's ``llama_model_tensor_buft_override``: tensors whose name matches go to ``buft``."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def repack_overrides(path: Path | str) -> ctypes.Array | None:
    """A NULL-terminated override list sending ``path``'s repackable matrices to ``CPU_REPACK``; None if none.

    llama.cpp offers its extra buffer types all or none (``use_extra_bufts``),
    and on AMX builds "all" means AMX first. An override names the buffer per
    tensor, and llama.cpp then skips its own check that the buffer can hold
    the tensor, so the list names only matrices of a type and shape the x86
    repack takes (read from the GGUF's tensor table). The caller keeps the
    array alive while the model loads.
    """
    buft = cpu_extra_buffer_types().get(REPACK)
    if buft is None:
        return None
    names = [
        name
        for name, kind, dims, rows, _ in gguf_tensor_table(str(path))
        if kind in REPACKED_TYPES and MATMUL_WEIGHT.match(name) and dims == 2 and rows % 8 == 0
    ]
    if not names:
        return None
    overrides = (TensorOverride * (len(names) + 1))()
    for entry, name in zip(overrides, names):
        entry.pattern = f"^{re.escape(name)}$".encode()
        entry.buft = buft
    return overrides


def apply_placement(placement: WeightPlacement, path: Path | str, params) -> ctypes.Array | None:
    """Set ``placement`` on llama.cpp's model ``params``; returns the override list, which the caller
    keeps alive until the load is done (llama.cpp holds only a pointer to it)."""
    params.use_extra_bufts = placement.extra_buffers
    overrides = repack_overrides(path) if placement.repack_only else None
    if overrides is not None:
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    return overrides
