"""Where a model's weights go: the layers llama.cpp offloads to a GPU, and for what stays on the CPU its extra
(AMX / repacked) buffers or plain memory."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

from localspec.llama.runtime import (
    amx_rows_without_tiles,
    amx_streamed_rows,
    cpu_buffer_type,
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
class Offload:
    """Which of a model's layers llama.cpp puts on a GPU.

    llama.cpp's rule (``llama_model::load_tensors``): ``n_gpu_layers`` counts
    the output layer first, then repeating blocks from the last one down; the
    token embeddings always stay on the CPU. Only the matrices that stay on
    the CPU are the CPU placement's business (see :func:`weight_placement`).
    """

    layers: int  # repeating blocks in the model
    gpu_blocks: int  # how many of them (the last ones) are on the GPU
    output_on_gpu: bool
    devices: tuple[str, ...] = ()  # where they go, e.g. ("CUDA0",)
    # the output layer overridden back to this machine's CPU: an RPC target without a local GPU, whose
    # logits would otherwise cross the network (a row of vocabulary floats per row) instead of a hidden state
    output_here: bool = False

    @property
    def everything(self) -> bool:
        """Every block and the output layer on the GPU: no matrix stays on the CPU."""
        return self.output_on_gpu and not self.output_here and self.gpu_blocks >= self.layers

    def on_cpu(self, tensor: str) -> bool:
        """Whether the weight named ``tensor`` stays in CPU memory."""
        if not self.output_on_gpu:  # the output layer is the first to go: without it, nothing went
            return True
        block = BLOCK.match(tensor)
        if block:
            return int(block.group(1)) < self.layers - self.gpu_blocks
        return self.output_here or not tensor.startswith("output.")

    @property
    def on_cuda(self) -> bool:
        """Whether the output layer (and so the row's logits) is computed on a CUDA GPU."""
        return self.output_on_gpu and any(device.startswith("CUDA") for device in self.devices)

    @property
    def computed_on(self) -> str:
        """Every device that computes part of a row, this machine's CPU included where a block or the output
        layer stays on it: where a measurement of the model's logits (batch invariance) holds."""
        if not self.output_on_gpu:
            return "the CPU"
        where = list(self.devices) or ["the GPU"]
        if self.output_here or self.gpu_blocks < self.layers:
            where.append("the CPU")
        return " + ".join(where)

    def describe(self, names: dict[str, str] | None = None) -> str:
        """``all 28 layers and the output on CUDA0``, ``4 of 28 layers and the output on CUDA0``, ``on the CPU``,
        ``all 28 layers on RPC[a:1] + RPC[b:2], the output here``; ``names`` adds a device's name where given
        (``CUDA0 (NVIDIA H200)``)."""
        if not self.output_on_gpu:
            return "on the CPU"
        names = names or {}
        where = " + ".join(f"{d} ({names[d]})" if names.get(d) else d for d in self.devices) or "the GPU"
        share = "all" if self.gpu_blocks >= self.layers else f"{self.gpu_blocks} of"
        if self.output_here:
            return f"{share} {self.layers} layers on {where}, the output here"
        return f"{share} {self.layers} layers and the output on {where}"


CPU_ONLY = Offload(0, 0, False)

#: On a CUDA GPU a decode of another size than the model's last one makes llama.cpp build (and capture) its graph
#: anew, which costs a small draft more than reading a few rows one at a time (docs/gpu.md, "Next on a GPU"). A
#: draft alternates its catch-up (the tokens it has not read, usually one or two) with one-row proposals, so up to
#: this many tokens it reads one row at a time.
ONE_ROW_CATCH_UP = 4


def one_row_extends(role: str, offload: Offload) -> int:
    """The longest extend decoded one row at a time, each row with its output, so that every decode of the
    model is the same graph (0: none). Only a draft whose output is on a local CUDA GPU: its target's
    verifications need their rows in one batch, a CPU's graph is cheap to build, and over RPC each decode is
    a round trip."""
    return ONE_ROW_CATCH_UP if role == "draft" and offload.on_cuda else 0


BLOCK = re.compile(r"^blk\.(\d+)\.")


def offload_plan(layers: int, n_gpu_layers: int, gpus: tuple[str, ...]) -> Offload:
    """llama.cpp's split for a model of ``layers`` blocks loaded with ``n_gpu_layers`` (negative: all) onto
    ``gpus`` (the names of :func:`~localspec.llama.runtime.offload_devices`; none: everything on the CPU)."""
    if not gpus or n_gpu_layers == 0:
        return CPU_ONLY
    offloaded = layers + 1 if n_gpu_layers < 0 else min(n_gpu_layers, layers + 1)  # the output counts as one
    return Offload(layers, offloaded - 1, True, gpus)


def model_layers(path: Path | str) -> int:
    """The number of repeating blocks in a GGUF (from its tensor names)."""
    blocks = [int(match.group(1)) for name, *_ in gguf_tensor_table(str(path)) if (match := BLOCK.match(name))]
    return max(blocks) + 1 if blocks else 0


@dataclass(frozen=True)
class WeightPlacement:
    """Where a model's weights go: the GPU split, whether the CPU part may use llama.cpp's extra buffer
    types, and whether each token needs its own decode.

    ``one_row_per_decode`` is only acted on where the AMX buffer really holds
    weights (see :func:`weight_placement`); ``repack_only`` puts the CPU's
    matrices that llama.cpp can repack in its repacked buffer while
    ``extra_buffers`` is off (so no AMX); ``reason`` is what the doctor shows.
    """

    extra_buffers: bool
    one_row_per_decode: bool
    reason: str
    repack_only: bool = False
    offload: Offload = CPU_ONLY


def weight_placement(role: str, path: Path | str, offload: Offload = CPU_ONLY) -> WeightPlacement:
    """Where ``role``'s weights go: the layers ``offload`` puts on a GPU stay there, and the CPU placement
    decides only for the matrices that stay on the CPU.

    A build compiled with AMX puts quantized weights in an AMX buffer, whose
    batches of two or more rows run AMX tile instructions that die with SIGILL
    on VMs that advertise AMX but do not enable its tile state. So on AMX
    builds a model takes the AMX buffer only where batches there need no
    tiles (localspec's AMX patches, with kernels for nearly all its CPU
    matrices, ``AMX_SHARE``), else is fed one row per decode, else loads
    without it, its Q4_0/Q4_K matrices still repacked (the kernels non-AMX
    builds use). The target needs the streamed-rows patch's kernels
    (``STREAMED_TYPES``), the draft any AMX kernels. The measurements behind
    each choice are in docs/performance.md (*CPU builds with AMX*).

    ``LOCALSPEC_EXTRA_BUFFERS=1`` says AMX tiles work here (normal batches,
    extra buffers for both); ``=0`` turns extra buffers off for both.
    """
    if offload.everything:
        return WeightPlacement(False, False, f"{offload.describe()} (no CPU extra buffers)", offload=offload)
    on_gpu = offload.describe() + "; " if offload.output_on_gpu else ""

    def placed(extra: bool, one_row: bool, reason: str, repack_only: bool = False) -> WeightPlacement:
        return WeightPlacement(extra, one_row, on_gpu + reason, repack_only, offload)

    value = extra_buffers_choice()
    if value == "1":
        return placed(True, False, "extra buffers on (LOCALSPEC_EXTRA_BUFFERS=1)")
    if value == "0":
        return placed(False, False, "extra buffers off (LOCALSPEC_EXTRA_BUFFERS=0)")
    if "AMX_INT8 = 1" not in system_info():
        return placed(True, False, "extra buffers on (no AMX in this build)")
    share = amx_share(path, offload=offload)
    streamed = _streamed(path, offload)
    amx = f"AMX build: AMX buffer ({share:.0%} of the CPU's weights)"
    if role == "target" and streamed:
        return placed(True, False, f"{amx}, batches streamed, up to 4 rows per pass on its one-row kernels "
                      "(no tile instructions)")  # fmt: skip
    if role == "draft" and share >= AMX_SHARE:
        if amx_rows_without_tiles():
            how = "streamed, up to 4 rows per pass" if streamed else "row by row"
            return placed(True, False, f"{amx}, batches {how} on its one-row kernels (no tile instructions)")
        return placed(True, True, f"{amx}, one row per decode (no tile instructions)")
    return placed(False, False, f"AMX build: no AMX buffer ({share:.0%} of the CPU's weights would go there; batches "
                  "would run AMX tiles), Q4_0/Q4_K matrices repacked", repack_only=True)  # fmt: skip


def _streamed(path: Path | str, offload: Offload = CPU_ONLY) -> bool:
    """Whether the build's streamed-rows kernels cover nearly all of the model's CPU matrices (by bytes)."""
    return amx_streamed_rows() and amx_share(path, STREAMED_TYPES, offload) >= AMX_SHARE


def llama_cpp_default_runs() -> bool:
    """Whether llama.cpp's own default placement (every extra buffer type, AMX's included) runs here, so
    its tools can be timed as they run by default: not where the user turned extra buffers off
    (``LOCALSPEC_EXTRA_BUFFERS=0``, and then like for like), and on AMX builds only where tiles work or
    batches in the AMX buffer skip them (localspec's AMX patch, whose ``GGML_AMX_NO_TILES`` the tools
    inherit from this process). Timed in plain memory instead, llama-server would be charged for a
    placement it never runs by default (docs/performance.md, "llama.cpp in its own placement")."""
    choice = extra_buffers_choice()
    if choice in ("0", "1"):
        return choice == "1"
    return "AMX_INT8 = 1" not in system_info() or amx_rows_without_tiles()


AMX_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")  # ggml-cpu/amx/common.h, qtype_has_amx_kernels
# share of a model's matrix bytes the AMX buffer (a target: its streamed kernels) must hold to get it (see above)
AMX_SHARE = 0.9
STREAMED_TYPES = ("Q4_0", "Q4_K", "Q6_K")  # the types with batch kernels in localspec's streamed-rows patch


def amx_share(path: Path | str, types: tuple[str, ...] = AMX_TYPES, offload: Offload = CPU_ONLY) -> float:
    """The share of the model's multiplied matrices that stay on the CPU (by bytes) in ``types`` (by default,
    those llama.cpp's AMX buffer takes)."""
    table = gguf_tensor_table(str(path))
    matrices = [(kind, size) for name, kind, _, _, size in table if MATMUL_WEIGHT.match(name) and offload.on_cpu(name)]
    total = sum(size for _, size in matrices)
    return sum(size for kind, size in matrices if kind in types) / total if total else 0.0


class TensorOverride(ctypes.Structure):
    """llama.cpp's ``llama_model_tensor_buft_override``: tensors whose name matches go to ``buft``."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def output_tensors(path: Path | str) -> list[str]:
    """The output layer's weights: its norm and matrix (the token embeddings where the model ties them)."""
    names = {name for name, *_ in gguf_tensor_table(str(path))}
    matrix = "output.weight" if "output.weight" in names else "token_embd.weight"
    return [name for name in ("output_norm.weight", matrix) if name in names]


def override_list(buffers: dict[str, int]) -> ctypes.Array | None:
    """A NULL-terminated llama.cpp override list: each tensor by exact name to its buffer type; None if empty."""
    if not buffers:
        return None
    overrides = (TensorOverride * (len(buffers) + 1))()
    for entry, (name, buft) in zip(overrides, buffers.items()):
        entry.pattern = f"^{re.escape(name)}$".encode()
        entry.buft = buft
    return overrides


def repack_overrides(path: Path | str, offload: Offload = CPU_ONLY) -> ctypes.Array | None:
    """A NULL-terminated override list sending ``path``'s repackable CPU matrices to ``CPU_REPACK``; None if none.

    llama.cpp offers its extra buffer types all or none (``use_extra_bufts``),
    and on AMX builds "all" means AMX first. An override names the buffer per
    tensor, and llama.cpp then skips its own check that the buffer can hold
    the tensor, so the list names only matrices of a type and shape the x86
    repack takes (read from the GGUF's tensor table). The caller keeps the
    array alive while the model loads.
    """
    return override_list(_repacked(path, offload))


def _repacked(path: Path | str, offload: Offload) -> dict[str, int]:
    buft = cpu_extra_buffer_types().get(REPACK)
    if buft is None:
        return {}
    return {
        name: buft
        for name, kind, dims, rows, _ in gguf_tensor_table(str(path))
        if kind in REPACKED_TYPES and MATMUL_WEIGHT.match(name) and dims == 2 and rows % 8 == 0 and offload.on_cpu(name)
    }


def apply_placement(placement: WeightPlacement, path: Path | str, params) -> ctypes.Array | None:
    """Set ``placement`` on llama.cpp's model ``params``; returns the override list, which the caller
    keeps alive until the load is done (llama.cpp holds only a pointer to it). An output layer kept here
    goes to plain CPU memory, or to the repacked buffer where the CPU placement repacks it."""
    params.use_extra_bufts = placement.extra_buffers
    buffers = dict.fromkeys(output_tensors(path), cpu_buffer_type()) if placement.offload.output_here else {}
    if placement.repack_only:
        buffers |= _repacked(path, placement.offload)
    overrides = override_list(buffers)
    if overrides is not None:
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    return overrides
