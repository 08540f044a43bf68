"""Placement on a GPU build, decided on the CPU with the GPU's facts stood in.

llama.cpp puts the output layer and the last blocks of a model on the GPU
(``n_gpu_layers`` of them); localspec's CPU placement (AMX, repacked buffers,
one row per decode) must only ever decide for the matrices that stay on the
CPU. A tensor override wins over the GPU split, so an override naming an
offloaded matrix pins it to CPU memory: the first look on a lent H200 found
a 7B target decoding at CPU speed (45 ms a token instead of 5.7) that way.
"""

from __future__ import annotations

import ctypes
import platform
from dataclasses import replace

import pytest

from localspec.llama import model as llama_model
from localspec.llama import placement, runtime
from localspec.llama.footprint import Footprint
from localspec.llama.model import LlamaSettings, choose_placement
from localspec.llama.placement import CPU_ONLY, Offload, offload_plan
from localspec.llama.runtime import Device

AMX_BUILD = "CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1"
H200 = Device("CUDA0", "NVIDIA H200", "GPU", "CUDA", 140 * 2**30, 143 * 2**30)
IGPU = Device("Vulkan0", "Intel(R) Graphics", "IGPU", "Vulkan", 0, 0)
CPU = Device("CPU", "AMD EPYC", "CPU", "CPU", 20 * 2**30, 24 * 2**30)


def test_the_gpu_split_follows_llama_cpps_rule() -> None:
    """n_gpu_layers counts the output layer first, then blocks from the last one down (llama_model::load_tensors:
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)); negative means all; no GPU means none."""
    gpus = ("CUDA0",)
    assert offload_plan(24, -1, gpus) == Offload(24, 24, True, gpus)
    assert offload_plan(24, 0, gpus) == CPU_ONLY
    assert offload_plan(24, 1, gpus) == Offload(24, 0, True, gpus)  # the output layer alone
    assert offload_plan(24, 5, gpus) == Offload(24, 4, True, gpus)
    assert offload_plan(24, 25, gpus).everything and offload_plan(24, 999, gpus).everything
    assert not offload_plan(24, 24, gpus).everything  # 24 = the output and 23 blocks: block 0 stays
    assert offload_plan(24, -1, ()) == CPU_ONLY

    part = offload_plan(24, 5, gpus)
    assert [part.on_cpu(f"blk.{i}.ffn_up.weight") for i in (0, 19, 20, 23)] == [True, True, False, False]
    assert not part.on_cpu("output.weight") and part.on_cpu("token_embd.weight")  # embeddings never move
    assert CPU_ONLY.on_cpu("output.weight") and CPU_ONLY.on_cpu("blk.23.attn_q.weight")
    assert part.describe() == "4 of 24 layers and the output on CUDA0"
    assert offload_plan(24, -1, gpus).describe() == "all 24 layers and the output on CUDA0"
    assert CPU_ONLY.describe() == "on the CPU"
    # where a measurement of the logits holds: every device that computes part of a row
    assert (CPU_ONLY.computed_on, offload_plan(24, -1, gpus).computed_on, part.computed_on) == (
        "the CPU",
        "CUDA0",
        "CUDA0 + the CPU",
    )


def test_only_a_draft_on_a_cuda_gpu_reads_short_extends_one_row_at_a_time() -> None:
    """A decode of another size than the last rebuilds llama.cpp's graph, dear on CUDA (the H100: 3.1 ms on
    the 0.5B draft, whose one-row decode took 1.66 ms). A draft there reads catch-ups of up to 4 tokens one
    row at a time; a target verifies in one batch; the CPU and RPC servers keep batching; Metal is
    unmeasured and keeps batching."""
    cuda = offload_plan(24, -1, ("CUDA0",))
    assert placement.one_row_extends("draft", cuda) == placement.ONE_ROW_CATCH_UP == 4
    assert placement.one_row_extends("draft", offload_plan(24, 5, ("CUDA0",))) == 4  # the output on the GPU
    assert placement.one_row_extends("target", cuda) == 0
    assert placement.one_row_extends("draft", CPU_ONLY) == 0
    assert placement.one_row_extends("draft", offload_plan(24, -1, ("RPC[10.0.0.2:50052]",))) == 0
    assert placement.one_row_extends("draft", offload_plan(24, -1, ("MTL0",))) == 0


def test_an_rpc_target_s_output_layer_kept_here_is_the_cpu_placement_s_business() -> None:
    """model.rpc_output "local": every block on the servers, the output layer in this machine's memory
    (so a hidden state crosses the network per row, not a row of logits); the CPU decisions then cover it."""
    from dataclasses import replace

    servers = ("RPC[10.0.0.2:50052]", "RPC[10.0.0.3:50052]")
    split = replace(offload_plan(28, -1, servers), output_here=True)
    assert split.on_cpu("output.weight") and split.on_cpu("output_norm.weight")
    assert not split.on_cpu("blk.0.attn_q.weight") and not split.on_cpu("blk.27.ffn_down.weight")
    assert not split.everything  # a matrix stays here
    assert split.describe() == "all 28 layers on RPC[10.0.0.2:50052] + RPC[10.0.0.3:50052], the output here"
    assert split.computed_on == "RPC[10.0.0.2:50052] + RPC[10.0.0.3:50052] + the CPU"  # the logits come from here
    assert offload_plan(28, -1, servers).everything  # the control: without it, nothing stays here


def test_layers_go_to_gpus_and_integrated_gpus_only_where_there_is_no_gpu() -> None:
    assert runtime.offload_devices((CPU, IGPU, H200)) == (H200,)
    assert runtime.offload_devices((CPU, IGPU)) == (IGPU,)
    assert runtime.offload_devices((CPU,)) == ()
    found = runtime.devices()  # this build's own registry: a CPU, described
    assert any(device.kind == "CPU" for device in found), found
    assert all(device.line().startswith(device.name) for device in found)
    if not runtime.gpu_offload_supported():
        assert runtime.offload_devices() == ()


def _q4_k_m_table(layers: int) -> tuple:
    """A Q4_K_M-like tensor table: Q4_K matrices, Q6_K output (what repack and AMX see)."""
    table = [("token_embd.weight", "Q4_K", 2, 151936, 100)]
    for i in range(layers):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            table.append((f"blk.{i}.{name}.weight", "Q4_K", 2, 896, 10))
        table.append((f"blk.{i}.attn_norm.weight", "F32", 1, 1, 1))
    table.append(("output.weight", "Q6_K", 2, 151936, 30))
    return tuple(table)


@pytest.fixture
def amx_host(monkeypatch):
    """An AMX build without localspec's AMX patches: the CPU placement would repack every Q4_K matrix."""
    monkeypatch.delenv("LOCALSPEC_EXTRA_BUFFERS", raising=False)
    monkeypatch.setattr(placement, "system_info", lambda: AMX_BUILD)
    monkeypatch.setattr(placement, "amx_rows_without_tiles", lambda: False)
    monkeypatch.setattr(placement, "amx_streamed_rows", lambda: False)
    monkeypatch.setattr(placement, "cpu_extra_buffer_types", lambda: {"AMX": 0x1000, "CPU_REPACK": 0x2000})
    monkeypatch.setattr(placement, "gguf_tensor_table", lambda path: _q4_k_m_table(4))


def _named(overrides) -> set[str]:
    return {entry.pattern.decode()[1:-1].replace("\\", "") for entry in overrides[:-1]}


def test_an_offloaded_model_is_never_pinned_to_a_cpu_buffer(amx_host) -> None:
    """Everything on the GPU: no override, no extra buffers, no one-row rule, whatever the CPU is."""
    everything = offload_plan(4, -1, ("CUDA0",))
    for role in ("target", "draft"):
        chosen = placement.weight_placement(role, "x.gguf", everything)
        assert (chosen.extra_buffers, chosen.repack_only, chosen.one_row_per_decode) == (False, False, False)
        assert chosen.reason.startswith("all 4 layers and the output on CUDA0")
        params = runtime.C.llama_model_default_params()
        assert placement.apply_placement(chosen, "x.gguf", params) is None and not params.tensor_buft_overrides
        assert params.use_extra_bufts is False

    # negative control: the same host with the model on the CPU pins every Q4_K matrix to CPU_REPACK
    on_cpu = placement.weight_placement("target", "x.gguf")
    assert on_cpu.repack_only and len(_named(placement.repack_overrides("x.gguf"))) == 4 * 7


def test_a_partly_offloaded_model_repacks_only_what_stays_on_the_cpu(amx_host) -> None:
    part = offload_plan(4, 3, ("CUDA0",))  # the output and blocks 2, 3 on the GPU
    chosen = placement.weight_placement("target", "x.gguf", part)
    assert (
        chosen.repack_only
        and chosen.offload == part
        and chosen.reason.startswith("2 of 4 layers and the output on CUDA0")
    )
    params = runtime.C.llama_model_default_params()
    overrides = placement.apply_placement(chosen, "x.gguf", params)
    named = _named(overrides)
    assert named and all(name.startswith(("blk.0.", "blk.1.")) for name in named), named
    assert ctypes.cast(overrides, ctypes.c_void_p).value == params.tensor_buft_overrides


def test_the_amx_share_counts_only_the_cpus_matrices(monkeypatch) -> None:
    """A draft whose offloaded part is all Q4_0 but whose CPU blocks are Q5_0 must not take the AMX buffer."""
    table = (
        ("blk.0.ffn_up.weight", "Q5_0", 2, 896, 10),
        ("blk.1.ffn_up.weight", "Q4_0", 2, 896, 10),
        ("output.weight", "Q4_0", 2, 151936, 80),
    )
    monkeypatch.setattr(placement, "gguf_tensor_table", lambda path: table)
    assert placement.amx_share("x.gguf") == pytest.approx(0.9)
    assert placement.amx_share("x.gguf", offload=offload_plan(2, 2, ("CUDA0",))) == 0.0  # blk.0 alone stays
    assert placement.model_layers("x.gguf") == 2


def test_choose_placement_asks_llama_cpp_for_its_gpus(amx_host, monkeypatch) -> None:
    """The load decides with the devices llama.cpp would offload to; n_gpu_layers 0 keeps everything on the CPU."""
    monkeypatch.setattr(llama_model, "model_layers", lambda path: 4)
    monkeypatch.setattr(llama_model, "offload_devices", lambda: (H200,))
    chosen = choose_placement(LlamaSettings(n_gpu_layers=-1), "target", "x.gguf")
    assert chosen.offload.everything and not chosen.repack_only
    assert choose_placement(LlamaSettings(n_gpu_layers=0), "target", "x.gguf").repack_only
    forced = choose_placement(LlamaSettings(n_gpu_layers=2, extra_buffers=False), "target", "x.gguf")
    assert forced.offload == Offload(4, 1, True, ("CUDA0",)) and not forced.extra_buffers
    monkeypatch.setattr(llama_model, "offload_devices", lambda: ())  # a CPU build: n_gpu_layers is moot
    assert choose_placement(LlamaSettings(n_gpu_layers=-1), "target", "x.gguf").offload == CPU_ONLY


def test_the_log_keeps_each_weight_buffer_and_its_size() -> None:
    log = runtime.log()
    log.model_buffers.clear()
    for line in (
        b"load_tensors: offloaded 29/29 layers to GPU\n",
        b"load_tensors:        CUDA0 model buffer size =   934.35 MiB\n",
        b"load_tensors:   CPU_Mapped model buffer size =   223.33 MiB\n",
    ):
        log._on_log(2, line, None)
    assert log.model_buffers == [("CUDA0", 934.35), ("CPU_Mapped", 223.33)]
    log.model_buffers.clear()


# ----------------------------------------------------------------------
# what the doctor and the bench say about a GPU, with its facts stood in
def test_the_doctor_names_the_gpu_its_memory_and_what_holds_there() -> None:
    from localspec.cli.doctor import backend_line, memory_lines

    gpu_build = {"gpu_offload": True, "devices": (CPU, H200), "gpus": (H200,)}
    line = backend_line(gpu_build, (H200,), -1)
    assert line.startswith("backend: CUDA — CUDA0 (NVIDIA H200, 143.0 GiB, 140.0 free)") and "all layers" in line
    assert "up to 10 layers" in backend_line(gpu_build, (H200,), 10)
    assert backend_line(gpu_build, (), 0) == "backend: CPU (AMD EPYC); GPU offload off (model.n_gpu_layers: 0)"
    assert "found none" in backend_line({**gpu_build, "gpus": ()}, (), -1)
    assert "no GPU backend" in backend_line({"gpu_offload": False, "devices": (CPU,), "gpus": ()}, (), -1)
    # the CPU is named by llama.cpp's CPU device, on any system; Python's guess only where that has no name
    unnamed = replace(CPU, description="?")
    guess = platform.processor() or platform.machine()
    assert backend_line({"gpu_offload": False, "devices": (unnamed, H200), "gpus": ()}, (), 0).startswith(
        f"backend: CPU ({guess});"
    )
    # models that fit the GPU are judged by its free memory, not by RAM; what stays on the CPU by RAM
    offloaded, embeddings = Footprint(90 * 2**30, 8 * 2**30, 2**30), Footprint(2**30)
    (line,) = memory_lines(offloaded, embeddings, (H200,), 32768)
    assert line.startswith("GPU memory: 140.0 GiB free on CUDA0; the pair needs about 99.00 GiB (weights 90.00, "
                           "KV cache of 32,768 tokens 8.00, compute 1.00) there: enough"), line  # fmt: skip
    (line,) = memory_lines(Footprint(120 * 2**30, 10 * 2**30), embeddings, (H200,), 65536)
    assert "NOT enough" in line and "n_gpu_layers" in line and "n_ctx" in line
    gpu_line, cpu_line = memory_lines(offloaded, Footprint(4 * 2**30, 2**30), (H200,), 32768)  # blocks left there
    assert gpu_line.startswith("GPU memory") and "; on the CPU the pair needs about 5.00 GiB" in cpu_line
    (line,) = memory_lines(Footprint(), Footprint(2**30), (), 4096)
    assert line.startswith("memory: ") and "the pair needs about 1.00 GiB" in line


def test_the_memory_estimate_splits_as_llama_cpp_offloads(demo_paths) -> None:
    """On a GPU, what a model needs splits with its layers: offloaded blocks take their weights and KV cache to
    the GPU, the output layer takes the compute buffer with it, the token embeddings stay; nothing is lost or
    counted twice (the demo target's real tensor table; the sizes themselves are checked against llama.cpp's
    log in tests/test_models.py)."""
    from localspec.llama.footprint import footprint
    from localspec.llama.placement import model_layers

    target = demo_paths[0]
    layers = model_layers(target)
    cpu_gpus, cpu_only = footprint(target, 4096, 512)
    assert cpu_gpus == Footprint() and cpu_only.kv_cache > 0 and cpu_only.compute > 0
    on_gpus, on_cpu = footprint(target, 4096, 512, offload_plan(layers, -1, ("CUDA0",)))
    assert on_gpus + on_cpu == cpu_only
    assert on_cpu.kv_cache == on_cpu.compute == 0 and 0 < on_cpu.weights < on_gpus.weights  # the embeddings
    part_gpus, part_cpu = footprint(target, 4096, 512, offload_plan(layers, 11, ("CUDA0",)))  # 10 blocks and output
    assert part_gpus + part_cpu == cpu_only and part_gpus.compute == cpu_only.compute
    assert part_gpus.kv_cache * layers == cpu_only.kv_cache * 10  # every block caches as much
    assert footprint(target, 4000, 512)[1].kv_cache == cpu_only.kv_cache  # the context rounds up to 256s


def test_a_gpu_that_computes_batches_differently_is_named_with_what_still_holds() -> None:
    from localspec.app.invariance import diagnose

    from .test_doctor import UNPATCHED, loader, report_for

    current = {"extra_buffers": False, "flash_attention": False}
    unfixable = {"the gpu kernels"}
    report = report_for({"the gpu kernels": True}, unfixable)
    on_gpu = diagnose(
        report, loader({"the gpu kernels": True}, unfixable, []), current, {**UNPATCHED, "device": "CUDA0"}
    )
    assert on_gpu.remedy is None and "on CUDA0" in on_gpu.cause and "MMVQ" not in on_gpu.cause
    assert "rejection mode" in on_gpu.fix and "n_gpu_layers: 0" in on_gpu.fix
    assert "make install" in on_gpu.fix  # a build without localspec's CUDA patch: the fix is the patched build
    patched = diagnose(report, loader({"the gpu kernels": True}, unfixable, []), current,
                       {**UNPATCHED, "device": "CUDA0", "cuda_patch": "yes"})  # fmt: skip
    assert "localspec's CUDA patch" in patched.cause and "make install" not in patched.fix
    assert "rejection mode" in patched.fix
    # Metal (here an Apple M2's, whose CPU pairs rows with int8 matrix multiplies): no CUDA patch to offer, and
    # the CPU is not offered as invariant
    metal = diagnose(report, loader({"the gpu kernels": True}, unfixable, []), current,
                     {**UNPATCHED, "device": "MTL0", "int8_matmul": "on"})  # fmt: skip
    assert "on MTL0" in metal.cause and "CUDA kernels only" in metal.cause and "make install" not in metal.fix
    assert "rejection mode" in metal.fix and "n_gpu_layers: 0" not in metal.fix
    on_cpu = diagnose(report, loader({"the gpu kernels": True}, unfixable, []), current, UNPATCHED)
    assert "CUDA" not in on_cpu.cause and "x86 CPUs" in on_cpu.fix  # negative control: the CPU keeps its words
    flash = {"extra_buffers": False, "flash_attention": True}
    found = diagnose(
        report_for(flash, {"flash_attention"}),
        loader(flash, {"flash_attention"}, []),
        flash,
        {**UNPATCHED, "device": "CUDA0"},
    )
    assert found.remedy == {"flash_attention": False} and "on CUDA0" in found.cause and "256" not in found.cause
    servers = "RPC[10.0.0.2:50052] + RPC[10.0.0.3:50052]"  # a target whose layers the RPC servers compute
    over_rpc = diagnose(report, loader({"the gpu kernels": True}, unfixable, []), current,
                        {**UNPATCHED, "device": servers, "rpc": "yes"})  # fmt: skip
    assert f"on {servers}" in over_rpc.cause and "RPC server" in over_rpc.cause and "CUDA" not in over_rpc.cause
    assert "localspec rpc-server" in over_rpc.fix and "rejection mode" in over_rpc.fix


def test_the_bench_header_names_the_gpu_and_the_split() -> None:
    from localspec.bench.e2e import hardware_line

    machine = {
        "cpu": "AMD EPYC",
        "cores": 16,
        "flags": ["avx2"],
        "weight_buffers": ["CUDA0", "CPU_Mapped"],
        "draft_weight_buffers": ["CUDA0"],
        "gpus": [H200.line()],
        "offload": {
            "target": "all 28 layers and the output on CUDA0",
            "draft": "all 24 layers and the output on CUDA0",
        },
    }
    line = hardware_line({"machine": machine, "settings": {}})
    assert line.startswith("GPU: CUDA0 (NVIDIA H200") and "target all 28 layers and the output on CUDA0" in line
    assert "CPU: AMD EPYC, 16 cores" in line and "target weights in CUDA0, CPU_Mapped" in line
    cpu_only = hardware_line({"machine": {**machine, "gpus": []}, "settings": {}})
    assert cpu_only.startswith("CPU: AMD EPYC") and "GPU" not in cpu_only


def test_the_doctor_lists_each_weight_buffer_with_its_size_and_the_split() -> None:
    from types import SimpleNamespace

    from localspec.cli.doctor import weights_line

    offloaded = SimpleNamespace(
        role="target",
        rows_per_decode=512,
        weight_buffer_mib={"CUDA0": 4460.2, "CPU_Mapped": 425.0},
        placement=placement.weight_placement("target", "x.gguf", offload_plan(28, -1, ("CUDA0",))),
    )
    assert weights_line(offloaded) == (
        "weights (target): CUDA0 4,460 MiB + CPU_Mapped 425 MiB, up to 512 rows per decode — "
        "all 28 layers and the output on CUDA0 (no CPU extra buffers)"
    )
    draft = SimpleNamespace(
        role="draft",
        rows_per_decode=512,
        one_row_up_to=placement.one_row_extends("draft", offload_plan(24, -1, ("CUDA0",))),
        weight_buffer_mib={"CUDA0": 265.0, "CPU_Mapped": 73.0},
        placement=placement.weight_placement("draft", "x.gguf", offload_plan(24, -1, ("CUDA0",))),
    )
    assert weights_line(draft) == (
        "weights (draft): CUDA0 265 MiB + CPU_Mapped 73 MiB, up to 512 rows per decode (up to 4 tokens one row "
        "at a time: one graph for every decode) — all 24 layers and the output on CUDA0 (no CPU extra buffers)"
    )


# ----------------------------------------------------------------------
# a machine with an NVIDIA GPU gets a CUDA build, or is told why not
def _tool(folder, name: str, script: str):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def test_make_install_builds_with_cuda_where_nvcc_and_a_gpu_are_found(tmp_path) -> None:
    """nvcc on PATH, or where the CUDA toolkit puts it without touching PATH, and a GPU that nvidia-smi lists:
    a CUDA build. A GPU without nvcc: a CPU build and a note that says why. Only the tools named here are on
    PATH (and sh, uname, grep, echo, true), so a CUDA toolkit on the machine that runs the test changes nothing."""
    import os
    import shutil
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = tmp_path / "base"
    for name in ("sh", "uname", "grep", "echo", "true"):
        base.mkdir(exist_ok=True)
        (base / name).symlink_to(shutil.which(name))
    gpu, no_gpu, toolkit = tmp_path / "gpu", tmp_path / "no-gpu", tmp_path / "cuda" / "bin"
    _tool(gpu, "nvidia-smi", '[ "$1" = -L ] && echo "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0)"')
    _tool(no_gpu, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    nvcc = _tool(toolkit, "nvcc", "echo nvcc")

    def flags(*path, cuda_dirs) -> tuple[str, str]:
        done = subprocess.run(
            [shutil.which("make"), "-s", "cmake-flags", f"PYTHON={sys.executable}", f"CUDA_DIRS={cuda_dirs}"],
            cwd=root, env={"PATH": os.pathsep.join(map(str, (*path, base))), "HOME": str(tmp_path)},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout, done.stderr

    out, err = flags(toolkit, gpu, cuda_dirs=tmp_path / "none")
    assert "-DGGML_CUDA=on" in out and "CMAKE_CUDA_COMPILER" not in out and err == ""  # CMake finds it on PATH
    out, err = flags(gpu, cuda_dirs=toolkit)
    assert f"-DGGML_CUDA=on -DCMAKE_CUDA_COMPILER={nvcc}" in out and err == ""
    out, err = flags(gpu, cuda_dirs=tmp_path / "none")
    assert "CUDA" not in out and "an NVIDIA GPU is present but no CUDA compiler" in err and "make install" in err
    # controls: nvcc without a GPU is a CPU build, and says nothing
    out, err = flags(toolkit, no_gpu, cuda_dirs=toolkit)
    assert "CUDA" not in out and err == ""


def test_the_doctor_says_when_a_build_without_cuda_leaves_a_gpu_idle(tmp_path, monkeypatch) -> None:
    from localspec.cli.doctor import backend_line, nvidia_gpus

    _tool(tmp_path, "nvidia-smi", 'echo "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0)"; echo "GPU 1: NVIDIA A10"')
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_gpus() == ("NVIDIA GeForce RTX 4090", "NVIDIA A10")
    cpu_build = {"gpu_offload": False, "devices": (CPU,), "gpus": ()}
    line = backend_line(cpu_build, (), -1, nvidia_gpus())
    assert line.startswith("backend: CPU (AMD EPYC); this build has no GPU backend, but this machine has NVIDIA")
    assert "Install the CUDA toolkit, then run `make install`" in line
    # controls: no nvidia-smi, or one that lists nothing, leaves the plain line
    _tool(tmp_path, "nvidia-smi", "exit 9")
    assert nvidia_gpus() == ()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert nvidia_gpus() == ()
    assert backend_line(cpu_build, (), -1, nvidia_gpus()) == "backend: CPU (AMD EPYC); this build has no GPU backend"


def test_the_chat_and_the_ui_say_where_each_model_computes(monkeypatch) -> None:
    """The chat's header and the UI's badge name each model's layers and their device: a GPU build that left a
    model on the CPU shows at a glance."""
    from types import SimpleNamespace

    from localspec.app import engine as engine_module
    from localspec.app.engine import Engine

    monkeypatch.setattr(runtime, "devices", lambda: (CPU, H200))
    monkeypatch.setattr(engine_module, "cpu_name", lambda build=None: "AMD EPYC")

    def where(target: Offload, draft: Offload | None) -> str:
        def model(offload):
            return SimpleNamespace(placement=SimpleNamespace(offload=offload))

        pair = SimpleNamespace(target=model(target), draft_model=model(draft) if draft else None,
                               settings=SimpleNamespace(resolved_threads=lambda: 2))  # fmt: skip
        return Engine.compute_line.fget(pair)

    gpu_target, gpu_draft = offload_plan(28, -1, ("CUDA0",)), offload_plan(24, -1, ("CUDA0",))
    assert where(gpu_target, gpu_draft) == (
        "target: all 28 layers and the output on CUDA0 (NVIDIA H200); "
        "draft: all 24 layers and the output on CUDA0 (NVIDIA H200)"
    )
    partly = where(offload_plan(28, 10, ("CUDA0",)), None)
    assert partly == "target: 9 of 28 layers and the output on CUDA0 (NVIDIA H200)"  # the output counts as one
    assert where(gpu_target, CPU_ONLY).endswith("; draft: on the CPU (AMD EPYC, 2 threads)")
    # control: a pair on the CPU is one phrase, with no GPU named
    assert where(CPU_ONLY, CPU_ONLY) == "both models on the CPU (AMD EPYC, 2 threads)"
    assert where(CPU_ONLY, None) == "the target on the CPU (AMD EPYC, 2 threads)"


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (
            "libcuda.so.1: cannot open shared object file: No such file or directory",
            "built for CUDA and NVIDIA's driver library does not load (",
        ),
        ("libggml-base.so: undefined symbol: ggml_abort", "llama-cpp-python is not importable ("),
    ],
)
def test_a_build_whose_libraries_do_not_load_says_why_in_one_line(tmp_path, failure: str, says: str) -> None:
    """llama-cpp-python's loader raises RuntimeError when a shared library does not load: a CUDA build whose
    machine lost its NVIDIA driver misses libcuda. Every command then says so in one line with the fix, no
    traceback; the loader's failure is stood in by a package of that name ahead of the installed one."""
    import os
    import subprocess
    import sys

    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"raise RuntimeError(\"Failed to load shared library '/venv/llama_cpp/lib/libllama.so': {failure}\")\n"
    )
    for command in (["doctor", "--pair", "demo"], ["generate", "--pair", "demo", "hello"]):
        done = subprocess.run(
            [sys.executable, "-m", "localspec", *command], env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().count("\n") == 0 and says in done.stderr and failure in done.stderr
        assert "make install" in done.stderr


def test_a_target_too_large_for_the_gpu_is_told_to_offload_fewer_layers() -> None:
    """llama.cpp's log of a CUDA load that runs out of GPU memory (its lines as ggml-cuda, ggml-alloc and
    llama_model_load write them): the message names the device's buffer, its size and offloading fewer layers,
    not a corrupt file; a corrupt file's reason is quoted from llama_model_load's line."""
    from pathlib import Path

    from localspec.core.errors import OutOfMemoryError
    from localspec.llama.model import load_failure

    cuda_out_of_memory = [
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 18432.00 MiB on device 0: cudaMalloc failed: "
        "out of memory\n",
        "alloc_tensor_range: failed to allocate CUDA0 buffer of size 19327352832\n",
        "llama_model_load: error loading model: unable to allocate CUDA0 buffer\n",
        "llama_model_load_from_file_impl: failed to load model\n",
    ]  # fmt: skip
    error = load_failure("target", Path("/m/qwen-32b.gguf"), cuda_out_of_memory, mapped=True)
    said = str(error)
    assert isinstance(error, OutOfMemoryError)  # a swap releases what is loaded and tries again
    assert said.startswith("target model qwen-32b.gguf does not fit in CUDA0's free memory: llama.cpp could not")
    assert "allocate its CUDA0 buffer of 18,432 MiB; offload fewer layers (--n-gpu-layers N" in said
    corrupt = [
        "llama_model_load: error loading model: tensor 'blk.16.ffn_down.weight' data is not within the file bounds\n",
        "llama_model_load_from_file_impl: failed to load model\n",
    ]  # fmt: skip
    error = load_failure("draft", Path("/m/d.gguf"), corrupt, mapped=True)
    said = str(error)
    assert not isinstance(error, OutOfMemoryError)
    assert said.startswith("draft model /m/d.gguf could not be loaded (llama.cpp: tensor 'blk.16.ffn_down.weight' "
                           "data is not within the file bounds); the file is truncated or corrupt")  # fmt: skip


def test_a_target_on_rpc_servers_is_not_counted_in_this_machine_s_memory(demo_paths) -> None:
    """The doctor's memory check counts what this machine holds: with the target's layers on RPC servers (whose
    own lines give their free memory) that is the draft; control: without servers, the pair."""
    from localspec.app.config import load_config
    from localspec.app.engine import pair_footprint
    from localspec.cli.doctor import memory_lines
    from localspec.llama.footprint import footprint

    target, draft, _ = demo_paths
    config = load_config().with_overrides({"model.target": str(target), "model.draft": str(draft)})
    remote = config.with_overrides({"model.rpc_servers": ("127.0.0.1:50052",)})
    n_ctx, n_batch = config.model.n_ctx, config.model.n_batch
    draft_only, pair = footprint(draft, n_ctx, n_batch)[1], footprint(target, n_ctx, n_batch)[1]
    assert pair_footprint(remote) == (Footprint(), draft_only)
    assert pair_footprint(config) == (Footprint(), draft_only + pair)
    (line,) = memory_lines(*pair_footprint(remote), (), n_ctx, "the draft (the target is on RPC servers)")
    assert "the draft (the target is on RPC servers) needs about" in line
