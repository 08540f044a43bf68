"""llama.cpp's process-wide state: the library, its log, the one compute thread, and build facts.

Nothing happens on import: :func:`start` (called by the first model load,
and by anything that asks about the build) sets the environment llama.cpp
reads, installs the log callback, initialises the backend and starts the
compute thread, once per process.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import itertools
import json
import os
import queue
import re
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.core.errors import ModelError


def unloadable_message(error: BaseException) -> str:
    """Why llama-cpp-python does not import, and the fix, in one line.

    Its loader raises RuntimeError when a shared library does not load. A CUDA build on a machine whose
    NVIDIA driver is gone (a container started without the GPU, a driver removed) misses libcuda; `make
    install` builds for what the machine has now, the CPU where no GPU answers.
    """
    if "libcuda" in str(error):
        return (
            f"llama-cpp-python was built for CUDA and NVIDIA's driver library does not load ({error}): "
            "check that `nvidia-smi` lists the GPU, or run `make install` to rebuild for this machine"
        )
    return f"llama-cpp-python is not importable ({error}); run `make install` to build it"


try:
    import llama_cpp.llama_cpp as C  # noqa: N812 - the C API, named as in llama.cpp's docs
except (ImportError, OSError, RuntimeError) as _error:  # a broken or foreign install (tests/test_gpu_placement.py)
    raise ModelError(unloadable_message(_error)) from None

# llama.cpp's CPU backend computes K-quant matmuls of 8 or more rows with a "tiled" kernel and
# fewer rows with vec_dot. Stock, the two round differently (Qwen2.5 Q4_K_M: max |diff| 0.38-0.59 at
# 8+ rows), so a verification batch would not score tokens as the target alone does. localspec's
# patch (patches/*-kquant-vec-dot-tiled-invariant.patch) makes the x86 vec_dot of Q4_K, Q5_K and Q6_K
# round exactly like the tiled kernel and keeps that kernel to those types: with it the kernel stays
# on, and verification batches of 8+ rows stay cheaper (docs/performance.md, "Small batches"). A build
# without the patch gets the kernel turned off. Read once by llama.cpp at its first matmul; an explicit
# GGML_CPU_TILED_MM wins (the doctor says what it does).
TILED_MATMUL_ENV = "GGML_CPU_TILED_MM"
TILED_PATCH = "kquant_vec_dot_tiled_invariant"  # the patch that makes the tiled kernel invariant (build_patches)
EXTRA_BUFFERS_ENV = "LOCALSPEC_EXTRA_BUFFERS"  # 1: extra buffers (AMX tiles included) for both models; 0: none
AMX_NO_TILES_ENV = "GGML_AMX_NO_TILES"  # read by localspec's AMX patches: batches in the AMX buffer without tiles
AMX_ROWS_PATCH = "speed_amx_rows_without_tiles"  # the patch that reads that variable
AMX_STREAMED_PATCH = "speed_amx_streamed_rows"  # the patch with batch kernels on top of it
PATCH_SYMBOL = "localspec_patch_"  # each patch exports localspec_patch_<its name> (patches/series)
PATCHED_LIBRARIES = ("ggml-base", "ggml-cpu", "ggml-rpc")  # the libraries patches/series changes, read whole
# The CUDA patch (patches/*-cuda-batch-invariant.patch) announces itself in libggml-cuda, too large to read whole.
# Up to 8 rows a batch (llama.cpp's MMVQ_MAX_BATCH_SIZE) it keeps every product in the one-row kernels; from 9
# on llama.cpp computes quantized products with another kernel family (MMQ), which no setting changes.
CUDA_PATCH = "cuda_batch_invariant"
# ... and a candidate the GPU check builds in to measure it (gpu/candidates/, not in patches/series)
CUDA_PATCHES = (CUDA_PATCH, "cuda_graph_per_shape")
CUDA_INVARIANT_ROWS = 8
# read by the patch: set (to anything, as its getenv reads it), upstream's kernel choice (for measuring)
CUDA_STOCK_DISPATCH_ENV = "LOCALSPEC_CUDA_STOCK_DISPATCH"


class ComputeThread:
    """The one OS thread that runs llama.cpp's computations (model loads, decodes), whoever asks.

    The CPU backend is built with OpenMP, and libgomp keeps a pool of worker
    threads for every thread that ever opened a parallel region. Once the
    threads it manages outnumber the CPUs, every barrier stops spinning and
    sleeps in the kernel instead — and a decode has hundreds of barriers:
    a pair loaded on one thread and decoded on another (the UI loads at
    start-up and replies on Gradio's worker threads) ran at less than half
    speed (docs/design.md, llama.cpp integration). Callers wait for the result
    as if they had called llama.cpp themselves.

    Every decode pays the hand-over, so it is two queue operations: a job
    queue the thread reads, and an answer queue per call (a reply never
    finds another call's answer). A thread pool's futures cost four times as
    much, and on a GPU a decode is a few milliseconds (docs/performance.md).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="llama-compute", daemon=True)
        self._thread.start()
        atexit.register(self.run, _nothing)  # at exit, the job in flight finishes before llama.cpp is torn down

    def _serve(self) -> None:
        while True:
            fn, args, answer = self._jobs.get()
            try:
                answer.put((True, fn(*args)))
            except BaseException as error:  # noqa: BLE001 - handed to the caller, as a direct call would raise it
                answer.put((False, error))

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the compute thread; its result or its exception."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        answer: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((fn, args, answer))
        try:
            ok, value = answer.get()
        except KeyboardInterrupt:
            # as with a direct call, llama.cpp finishes first, so the cache bookkeeping is never behind it
            _wait_out(answer)
            raise
        if ok:
            return value
        raise value


def _nothing() -> None:
    return None


def _wait_out(answer: queue.SimpleQueue) -> None:
    """Wait for a job's answer through any further Ctrl-C."""
    while True:
        try:
            answer.get()
            return
        except KeyboardInterrupt:
            continue


MODEL_BUFFER_LINE = re.compile(r"(\S+) model buffer size =\s*([0-9.]+) MiB")
CONTEXT_BUFFER_LINE = re.compile(r"(\S+) (KV|compute) buffer size =\s*([0-9.]+) MiB")  # at a context's creation
LAYER_LINE = re.compile(r"layer +\d+ assigned to device (\S+?),")  # llama.cpp's debug line at load


class LlamaLog:
    """Keeps llama.cpp's recent log lines so load errors can quote them; prints only when verbose."""

    def __init__(self) -> None:
        self.lines: deque[tuple[int, str]] = deque(maxlen=200)
        self.model_buffers: list[tuple[str, float]] = []  # (buffer, MiB) the last loaded model's weights went to
        self.model_layers: list[str] = []  # the device of each of its layers, in order
        self.context_buffers: list[tuple[str, str, float]] = []  # ("KV" or "compute", buffer, MiB) of the last context
        self.verbose = bool(os.environ.get("LOCALSPEC_VERBOSE"))
        self._last_level = 2
        self._callback = C.llama_log_callback(self._on_log)  # referenced so it is never collected
        C.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        # ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
        if level == 5:
            level = self._last_level
        self._last_level = level
        line = text.decode("utf-8", errors="replace")
        self.lines.append((level, line))
        buffer = MODEL_BUFFER_LINE.search(line)  # e.g. "load_tensors:        CUDA0 model buffer size =   934.35 MiB"
        if buffer:
            self.model_buffers.append((buffer.group(1), float(buffer.group(2))))
        context_buffer = CONTEXT_BUFFER_LINE.search(
            line
        )  # e.g. "llama_kv_cache:      CUDA0 KV buffer size = 112.00 MiB"
        if context_buffer:
            self.context_buffers.append(
                (context_buffer.group(2), context_buffer.group(1), float(context_buffer.group(3)))
            )
        layer = LAYER_LINE.search(line)  # e.g. "load_tensors: layer  12 assigned to device RPC0, is_swa = 0"
        if layer:
            self.model_layers.append(layer.group(1))
        if self.verbose and level >= 3:
            sys.stderr.write(line)

    def last_error(self) -> str:
        """The most recent line that looks like an error, without llama.cpp's function prefix."""
        for _level, line in reversed(self.lines):
            low = line.lower()
            if "error" in low or "failed" in low or "invalid" in low or "not within" in low:
                text = line.strip()
                return text.split(": ", 1)[1] if ": " in text else text
        return ""


@functools.cache
def start() -> tuple[ComputeThread, LlamaLog]:
    """Set up llama.cpp for this process (once): environment, log capture, backend, compute thread."""
    check_cxx_runtime()
    os.environ.setdefault("GGML_LOG_LEVEL", "error")
    os.environ.setdefault(TILED_MATMUL_ENV, "1" if tiled_matmul_invariant() else "0")  # before the first matmul
    if amx_rows_without_tiles() and extra_buffers_choice() != "1":
        os.environ.setdefault(AMX_NO_TILES_ENV, "1")  # unless the user declared that AMX tiles work here
    log = LlamaLog()
    C.llama_backend_init()
    return ComputeThread(), log


def compute(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the one compute thread (see :class:`ComputeThread`)."""
    return start()[0].run(fn, *args)


def log() -> LlamaLog:
    return start()[1]


def system_info() -> str:
    """llama.cpp's feature line, e.g. ``CPU : AVX2 = 1 | ... | LLAMAFILE = 1``."""
    start()
    return C.llama_print_system_info().decode("utf-8", errors="replace").strip()


@functools.cache
def build_stamp() -> dict | None:
    """What `make install` recorded about the llama-cpp-python wheel it installed (read once: the
    library this process loaded does not change under it)."""
    stamp = Path(sys.prefix) / "localspec-llama-build.json"
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


CXX_RUNTIME_SYMBOL = "_ZNSt6locale7classicEv"  # std::locale::classic(): defined only by a C++ runtime itself


def library_files(folder: Path | None = None) -> dict[str, Path]:
    """One file per library in llama-cpp-python's ``lib`` folder, by name (``{"ggml-base": .../libggml-base.so}``):
    the folder holds a copy under each of a library's names (``libllama.so``, ``.so.0``, ``.so.0.5.0``)."""
    if folder is None:
        import llama_cpp

        folder = Path(llama_cpp.__file__).parent / "lib"
    by_library: dict[str, Path] = {}
    for path in sorted(folder.glob("lib*"), key=lambda path: (len(path.name), path.name)):
        if path.is_file():
            by_library.setdefault(re.split(r"\.(?:so|dylib|dll)", path.name)[0].removeprefix("lib"), path)
    return by_library


def defines_symbol(library: Path, name: str) -> bool:
    """Whether ``library`` defines (not merely references) the exported symbol ``name``. Read from the dynamic
    symbol table's hash, without loading the library; a file that is not ELF (macOS, Windows) has none."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with library.open("rb") as file:
            elf = ELFFile(file)
            # the symbol hash table answers in a millisecond; a whole table read by name takes 100s of ms
            table = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
            if table is not None:
                symbols = [found] if (found := table.get_symbol(name)) else []
            else:
                symbols = elf.get_section_by_name(".dynsym").get_symbol_by_name(name) or []
            return any(symbol["st_shndx"] != "SHN_UNDEF" for symbol in symbols)
    except ELFError:
        return False


def exports_cxx_runtime(library: Path) -> bool:
    """Whether ``library`` exports a C++ runtime of its own: libstdc++ linked into it statically with its
    symbols left public. Libraries built so bind to one another's copy, whose state (locales, facets) that
    copy never set up — on CUDA a model load crashed in llama.cpp's first number written to a stream."""
    return defines_symbol(library, CXX_RUNTIME_SYMBOL)


def check_cxx_runtime(folder: Path | None = None) -> None:
    """Refuse a llama.cpp build whose libraries export C++ runtimes of their own (:func:`exports_cxx_runtime`),
    with the fix, rather than crash at the first model load."""
    exporting = [path.name for path in library_files(folder).values() if exports_cxx_runtime(path)]
    if exporting:
        raise ModelError(
            f"llama-cpp-python's {', '.join(exporting)} export a C++ runtime linked into them statically, and "
            "loading a model would crash; rebuild it with `make install`, which keeps each library's copy private "
            "(-Wl,--exclude-libs,ALL)"
        )


@functools.cache
def build_patches() -> tuple[str, ...]:
    """localspec's patches in the llama.cpp this process loads, as each announces itself: an exported
    symbol ``localspec_patch_<name>`` (``-`` as ``_``) in the ggml library it changes, found in the export
    tables of the libraries patches change (read as bytes: opening a second copy of a library would give
    it state of its own). One file per library: the wheel holds a copy under each of its names, and a
    GPU backend's library can be hundreds of MB: the CUDA patch's symbol is looked up in its hash table instead.
    A stock build has none."""
    symbol = re.compile(re.escape(PATCH_SYMBOL.encode()) + rb"(\w+)")
    found: set[str] = set()
    libraries = library_files()
    for library in PATCHED_LIBRARIES:
        if library in libraries:
            found |= {name.decode() for name in symbol.findall(libraries[library].read_bytes())}
    if "ggml-cuda" in libraries:
        found |= {name for name in CUDA_PATCHES if defines_symbol(libraries["ggml-cuda"], PATCH_SYMBOL + name)}
    return tuple(sorted(found))


def cuda_batch_invariant() -> bool:
    """Whether the installed build has localspec's CUDA patch: on an NVIDIA GPU, batches of up to
    :data:`CUDA_INVARIANT_ROWS` rows run the one-row kernels, so each row equals the same row decoded alone."""
    return CUDA_PATCH in build_patches() and CUDA_STOCK_DISPATCH_ENV not in os.environ


def tiled_matmul_invariant() -> bool:
    """Whether the installed build rounds single rows like the tiled matmul (localspec's K-quant patch)."""
    return TILED_PATCH in build_patches()


def extra_buffers_choice() -> str:
    """The user's ``LOCALSPEC_EXTRA_BUFFERS``: "1" (AMX tiles work here), "0" (no extra buffers), or ""
    (localspec decides)."""
    return os.environ.get(EXTRA_BUFFERS_ENV, "").strip()


def amx_rows_without_tiles() -> bool:
    """Whether the installed build can run a batch in llama.cpp's AMX buffer without tile instructions
    (localspec's AMX patch: with ``GGML_AMX_NO_TILES`` set, each row of a batch takes the one-row
    AVX512-VNNI kernels while a block of weights is in cache, so the weights are read once per batch
    and every row equals the same row decoded alone). Without it, a model in that buffer on a CPU
    whose tiles die must be fed one row per decode (see :func:`~localspec.llama.placement.weight_placement`)."""
    return AMX_ROWS_PATCH in build_patches()


def amx_streamed_rows() -> bool:
    """Whether the installed build has localspec's streamed-rows patch on top of :func:`amx_rows_without_tiles`'s:
    batches in the AMX buffer take up to 4 rows per pass over the weights (Q4_0, Q4_K, Q6_K), in memory
    order with a prefetch, each row bit-identical to the one-row kernel's."""
    return AMX_STREAMED_PATCH in build_patches()


def tiled_matmul_enabled() -> bool:
    """Whether llama.cpp's batch-size-dependent tiled K-quant matmul is on in this process."""
    start()
    value = os.environ.get(TILED_MATMUL_ENV, "1").strip()
    return value not in ("0", "")


def llama_cpp_version() -> str:
    import llama_cpp

    return getattr(llama_cpp, "__version__", "unknown")


@functools.cache
def gpu_offload_supported() -> bool:
    """Whether this build has a local GPU backend (CUDA, Metal, ...). ``llama_supports_gpu_offload`` says yes
    for the RPC backend too, which offloads to other machines (:mod:`localspec.llama.rpc`)."""
    start()
    lib = _ggml()
    backends = {
        _text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))) for i in range(lib.ggml_backend_reg_count())
    }
    return bool(backends - {"CPU", "RPC"})


DEVICE_KINDS = ("CPU", "GPU", "IGPU", "ACCEL", "META")  # ggml_backend_dev_type, in its order


@dataclass(frozen=True)
class Device:
    """One device of ggml's backend registry, as llama.cpp sees it."""

    name: str  # "CPU", "CUDA0", "MTL0", "RPC[host:port]"
    description: str  # "NVIDIA H200", "Apple M3 Max", the CPU's model name
    kind: str  # one of DEVICE_KINDS
    backend: str  # the registry it belongs to: "CPU", "CUDA", "Metal", "RPC", ...
    free_bytes: int
    total_bytes: int

    def line(self) -> str:
        """``CUDA0 (NVIDIA H200, 139.8 GiB, 139.1 free)`` for the doctor and the bench header."""
        memory = f", {self.total_bytes / 2**30:.1f} GiB, {self.free_bytes / 2**30:.1f} free" if self.total_bytes else ""
        return f"{self.name} ({self.description}{memory})"


@functools.cache
def devices() -> tuple[Device, ...]:
    """Every device llama.cpp can use in this process (read once: the registry is fixed at start-up)."""
    start()
    lib = _ggml()
    found = []
    for index in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(device)
        registry = lib.ggml_backend_dev_backend_reg(device)
        found.append(Device(
            name=_text(lib.ggml_backend_dev_name(device)),
            description=_text(lib.ggml_backend_dev_description(device)).strip(),
            kind=DEVICE_KINDS[kind] if 0 <= kind < len(DEVICE_KINDS) else f"type {kind}",
            backend=_text(lib.ggml_backend_reg_name(registry)),
            free_bytes=free.value,
            total_bytes=total.value,
        ))  # fmt: skip
    return tuple(found)


def _text(raw: bytes | None) -> str:
    return (raw or b"?").decode(errors="replace")


def offload_devices(found: tuple[Device, ...] | None = None) -> tuple[Device, ...]:
    """The devices llama.cpp offloads layers to when a model names none (its default selection,
    ``llama_prepare_model_devices``): every GPU, and integrated GPUs only where there is no other."""
    found = devices() if found is None else found
    gpus = tuple(device for device in found if device.kind == "GPU")
    return gpus or tuple(device for device in found if device.kind == "IGPU")


class GgufInitParams(ctypes.Structure):
    """ggml's ``gguf_init_params``: read tensor metadata only (``no_alloc``), into a context at ``ctx``."""

    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


@functools.cache
def _ggml():
    """ggml's C library as llama_cpp loaded it (libggml, with libggml-base under it), for the calls
    llama-cpp-python binds no Python function to; each is declared once, here."""
    from llama_cpp._ggml import libggml

    voidp, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, restype, argtypes in (
        ("ggml_backend_dev_by_type", voidp, [ctypes.c_int]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", voidp, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [voidp]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [voidp]),
        ("ggml_backend_dev_type", ctypes.c_int, [voidp]),
        ("ggml_backend_dev_memory", None, [voidp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [voidp]),
        ("ggml_backend_reg_count", ctypes.c_size_t, []),
        ("ggml_backend_reg_get", voidp, [ctypes.c_size_t]),
        ("ggml_backend_reg_by_name", voidp, [ctypes.c_char_p]),
        ("ggml_backend_reg_dev_count", ctypes.c_size_t, [voidp]),
        ("ggml_backend_reg_dev_get", voidp, [voidp, ctypes.c_size_t]),
        ("ggml_backend_dev_by_name", voidp, [ctypes.c_char_p]),
        ("ggml_backend_dev_backend_reg", voidp, [voidp]),
        ("ggml_backend_reg_get_proc_address", voidp, [voidp, ctypes.c_char_p]),
        ("ggml_backend_buft_name", ctypes.c_char_p, [voidp]),
        ("ggml_backend_dev_buffer_type", voidp, [voidp]),
        ("gguf_init_from_file", voidp, [ctypes.c_char_p, GgufInitParams]),
        ("gguf_get_n_tensors", i64, [voidp]),
        ("gguf_get_tensor_name", ctypes.c_char_p, [voidp, i64]),
        ("gguf_get_tensor_type", ctypes.c_int, [voidp, i64]),
        ("gguf_get_tensor_size", ctypes.c_size_t, [voidp, i64]),
        ("gguf_free", None, [voidp]),
        ("ggml_get_tensor", voidp, [voidp, ctypes.c_char_p]),
        ("ggml_n_dims", ctypes.c_int, [voidp]),
        ("ggml_nrows", i64, [voidp]),
        ("ggml_type_name", ctypes.c_char_p, [ctypes.c_int]),
        ("ggml_free", None, [voidp]),
    ):
        function = getattr(libggml, name)
        function.restype, function.argtypes = restype, argtypes
    return libggml


@functools.cache
def gguf_tensor_table(path: str) -> tuple[tuple[str, str, int, int, int], ...]:
    """(name, type, dimensions, rows, bytes) of every tensor in a GGUF file; () if ggml cannot read it.

    Read by ggml's own GGUF parser with no tensor data: ~0.1 s for a model
    whose 150,000-token vocabulary took the pure-Python ``gguf`` reader 12 s.
    A file it cannot read is left to the model load, which says why.
    """
    lib = _ggml()
    tensors = ctypes.c_void_p()
    context = lib.gguf_init_from_file(str(path).encode(), GgufInitParams(True, ctypes.pointer(tensors)))
    if not context:
        return ()
    try:
        table = []
        for index in range(lib.gguf_get_n_tensors(context)):
            name = lib.gguf_get_tensor_name(context, index)
            tensor = lib.ggml_get_tensor(tensors, name)
            kind = (
                lib.ggml_type_name(lib.gguf_get_tensor_type(context, index)).decode().upper()
            )  # "Q4_K", as GGML_TYPE_Q4_K
            table.append(
                (
                    name.decode(),
                    kind,
                    lib.ggml_n_dims(tensor),
                    lib.ggml_nrows(tensor),
                    lib.gguf_get_tensor_size(context, index),
                )
            )
        return tuple(table)
    finally:
        lib.gguf_free(context)
        if tensors:
            lib.ggml_free(tensors)


@functools.cache
def cpu_buffer_type() -> int:
    """The CPU device's plain buffer type (an override's pointer, see :func:`cpu_extra_buffer_types`)."""
    start()
    libggml = _ggml()
    device = libggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    return int(libggml.ggml_backend_dev_buffer_type(device))


@functools.cache
def cpu_extra_buffer_types() -> dict[str, int]:
    """llama.cpp's extra CPU buffer types in this build, by name (``{"AMX": ptr, "CPU_REPACK": ptr}``).

    llama-cpp-python binds none of ggml's backend-registry functions, so they
    are looked up in the ggml library it loaded; an override of a tensor's
    buffer type (``llama_model_params.tensor_buft_overrides``) needs the pointer.
    """
    start()
    libggml = _ggml()
    voidp = ctypes.c_void_p
    device = libggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    address = libggml.ggml_backend_reg_get_proc_address(
        libggml.ggml_backend_dev_backend_reg(device), b"ggml_backend_dev_get_extra_bufts"
    )
    if not device or not address:
        return {}
    listed = ctypes.CFUNCTYPE(ctypes.POINTER(voidp), voidp)(address)(device)  # NULL-terminated
    found: dict[str, int] = {}
    for index in itertools.count():
        if not listed[index]:
            return found
        found[libggml.ggml_backend_buft_name(listed[index]).decode()] = int(listed[index])
