"""Where a model's weights go: llama.cpp's extra (AMX / repacked) CPU buffers or plain memory."""

from __future__ import annotations

import os
from dataclasses import dataclass

from localspec.llama.runtime import system_info


@dataclass(frozen=True)
class WeightPlacement:
    """Whether a model may use llama.cpp's extra CPU buffer types, and whether each token needs its own decode.

    ``one_row_per_decode`` is only acted on where the AMX buffer really holds
    weights (see :func:`weight_placement`); ``reason`` is what the doctor shows.
    """

    extra_buffers: bool
    one_row_per_decode: bool
    reason: str


def weight_placement(role: str) -> WeightPlacement:
    """Where ``role``'s weights go: AMX/repacked extra buffers or plain CPU memory.

    A build compiled with AMX (``-march=native`` on a Sapphire-Rapids-class
    CPU) puts quantized weights (Q4_0/Q4_1/Q8_0/K-quants) in an AMX buffer.
    Batches of two or more rows then run AMX tile instructions, which die with
    SIGILL (``tileloadd``) on VMs that advertise AMX but do not enable its tile
    state (measured here: Firecracker guests). Batches of one row take a
    separate AVX512-VNNI path with no tiles, measured 1.5-1.8x faster than the
    plain Q4_1 kernel on this machine (13.7 -> 7.6-9.4 ms per token on 2
    threads). Hence, on AMX builds:

    * the **draft** keeps the AMX buffer and is fed one row per decode — it
      decodes one token at a time anyway; only its prompt is slower (~1.4x);
    * the **target** loads without extra buffers, because its speed comes
      from verifying K+1 rows in one batch.

    ``LOCALSPEC_EXTRA_BUFFERS=1`` says AMX tiles work here (normal batches,
    extra buffers for both); ``=0`` turns extra buffers off for both.
    """
    value = os.environ.get("LOCALSPEC_EXTRA_BUFFERS", "").strip()
    if value == "1":
        return WeightPlacement(True, False, "extra buffers on (LOCALSPEC_EXTRA_BUFFERS=1)")
    if value == "0":
        return WeightPlacement(False, False, "extra buffers off (LOCALSPEC_EXTRA_BUFFERS=0)")
    if "AMX_INT8 = 1" not in system_info():
        return WeightPlacement(True, False, "extra buffers on (no AMX in this build)")
    if role == "draft":
        return WeightPlacement(True, True, "AMX build: AMX buffer, one row per decode (no tile instructions)")
    return WeightPlacement(False, False, "AMX build: plain CPU buffers, so verification batches never run AMX tiles")
