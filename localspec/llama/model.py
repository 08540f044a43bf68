"""One GGUF model and its context, through llama-cpp-python's low-level API.

One :class:`LlamaModel` owns one model and one context (sequence 0). It
implements the loop's :class:`~localspec.core.model.LanguageModel` and
:class:`~localspec.core.model.Vocabulary` protocols:

* ``extend`` submits tokens with ``llama_decode`` in ``n_batch`` chunks and
  asks for logits only on the rows the sampler needs — never ``logits_all``,
  which would store ``n_ctx x n_vocab`` floats and run the output layer on
  every prompt token.
* ``truncate`` removes positions with ``llama_memory_seq_rm`` and checks its
  result: recurrent and hybrid memories cannot drop a suffix, and a silent
  failure there would leave rejected tokens in the cache (docs/design.md, Verification rules, bug 4).
* Model loads and decodes of every model run on one thread
  (:class:`localspec.llama.runtime.ComputeThread`), whichever thread asks for them.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from localspec.core.errors import IncompatiblePairError, ModelError, OutOfMemoryError, PromptTooLongError
from localspec.llama import rpc, runtime
from localspec.llama.placement import (
    CPU_ONLY,
    WeightPlacement,
    apply_placement,
    model_layers,
    offload_plan,
    one_row_extends,
    weight_placement,
)
from localspec.llama.runtime import C, compute, log, offload_devices

GGUF_MAGIC = b"GGUF"
_VOCAB_TYPES = {
    0: "none",
    1: "SentencePiece (SPM)",
    2: "byte-level BPE",
    3: "WordPiece",
    4: "Unigram (T5)",
    5: "RWKV",
    6: "PLaMo-2",
}


@dataclass(frozen=True)
class LlamaSettings:
    """What a context is created with (from the ``model`` section of the config)."""

    n_ctx: int = 4096
    n_batch: int = 512
    threads: int = 0
    n_gpu_layers: int = -1
    flash_attention: bool = False
    use_mmap: bool = True
    extra_buffers: bool | None = None  # None: decided per role by weight_placement; False/True: forced
    rpc_servers: tuple[str, ...] = ()  # llama.cpp RPC servers for the target's layers (llama/rpc.py)
    rpc_output: str = "remote"  # their output layer on the last server, or "local" (a hidden state per row crosses)

    def resolved_threads(self) -> int:
        if self.threads > 0:
            return self.threads
        try:
            import psutil

            return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
        except ImportError:  # pragma: no cover
            return max(1, os.cpu_count() or 1)


def check_gguf_file(path: Path, role: str) -> None:
    """Fail early, with a fix, for the common bad files: missing, a folder, not GGUF, too short."""
    hint = f"run `localspec models prepare` for the demo pair, or set model.{role} in config.yaml"
    if not path.exists():
        raise ModelError(f"{role} model {path} does not exist; {hint}")
    if path.is_dir():
        raise ModelError(f"{role} model {path} is a folder, not a .gguf file; {hint}")
    size = path.stat().st_size
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{role} model {path} is not a GGUF file (starts with {magic!r}); {hint}")
    if size < 1024:
        raise ModelError(f"{role} model {path} is truncated ({size} bytes); {hint}")


UNALLOCATED = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")  # ggml-alloc's line, any backend
LOAD_REASON = re.compile(r"error loading model: (.+)")  # llama_model_load's line: the exception's message


def load_failure(role: str, path: Path, log_lines: Sequence[str], mapped: bool) -> ModelError:
    """Why llama.cpp did not load a model, with the fix that fits, from its log: memory it could not allocate
    (a target too large for the GPU is the common case there) is no corrupt file, and re-downloading it
    would not help."""
    short = next((found for line in reversed(log_lines) if (found := UNALLOCATED.search(line))), None)
    if short:
        buffer, mib = short.group(1), int(short.group(2)) / 2**20
        if buffer.startswith("CPU"):
            where = "memory"
            fix = "free memory or pick a smaller pair" + ("" if mapped else ", or set model.use_mmap: true")
        else:
            where = f"{buffer}'s free memory"
            fix = (
                "offload fewer layers (--n-gpu-layers N, model.n_gpu_layers), pick a smaller pair, or free memory there"
            )
        return OutOfMemoryError(f"{role} model {path.name} does not fit in {where}: llama.cpp could not allocate "
                                f"its {buffer} buffer of {mib:,.0f} MiB; {fix}")  # fmt: skip
    reason = next((found.group(1).strip() for line in reversed(log_lines) if (found := LOAD_REASON.search(line))), "")
    said = f" (llama.cpp: {reason})" if reason else ""
    fix = "the file is truncated or corrupt — re-download it or run `localspec models prepare`"
    return ModelError(f"{role} model {path} could not be loaded{said}; {fix}")


def choose_placement(settings: LlamaSettings, role: str, path: Path) -> WeightPlacement:
    """Where ``role``'s weights go under ``settings``: llama.cpp's GPU split first, then for what stays on
    the CPU the placement :func:`weight_placement` chooses, or the extra buffers ``settings`` forces."""
    remote = tuple(f"RPC[{endpoint}]" for endpoint in settings.rpc_servers) if role == "target" else ()
    local_gpus = tuple(device.name for device in offload_devices())
    gpus = remote + local_gpus if settings.n_gpu_layers != 0 else ()
    offload = offload_plan(model_layers(path), settings.n_gpu_layers, gpus) if gpus else CPU_ONLY
    if remote and not local_gpus and settings.rpc_output == "local" and offload.output_on_gpu:
        offload = replace(offload, output_here=True)  # with a local GPU the output is already on it (the last)
    if settings.extra_buffers is None:
        return weight_placement(role, path, offload)
    state = "on" if settings.extra_buffers else "off"
    where = f"{offload.describe()}; " if offload.output_on_gpu else ""
    return WeightPlacement(settings.extra_buffers, False, f"{where}extra buffers {state} (chosen for batch invariance)",
                           offload=offload)  # fmt: skip


# ----------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------
class LlamaModel:
    """One GGUF model with one context; a :class:`LanguageModel` and a :class:`Vocabulary`."""

    def __init__(
        self,
        path: str | Path,
        settings: LlamaSettings = LlamaSettings(),
        role: str = "target",
        on_progress: Callable[[float], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.role = role
        self.name = self.path.name
        self.settings = settings
        self._lock = threading.RLock()
        check_gguf_file(self.path, role)

        self.placement = choose_placement(settings, role, self.path)
        self._model = self._load_weights(on_progress)
        self._ctx = self._create_context()
        self._memory = C.llama_get_memory(self._ctx)
        self._n_ctx = int(C.llama_n_ctx(self._ctx))  # llama.cpp rounds up to a multiple of 256
        self._n_batch = int(C.llama_n_batch(self._ctx))  # and caps the batch at the requested n_ctx
        self._batch = C.llama_batch_init(self._n_batch, 0, 1)
        # one row per decode only where the AMX buffer really holds weights (see weight_placement)
        self.rows_per_decode = (
            1 if self.placement.one_row_per_decode and "AMX" in self.weight_buffers else self._n_batch
        )
        self.one_row_up_to = one_row_extends(role, self.placement.offload)  # a draft on CUDA: one graph for all
        self._tokens: list[int] = []
        self._pieces: dict[int, bytes] = {}
        self._decode_s = 0.0
        self.n_evaluated = 0  # tokens evaluated over the model's lifetime (KV-reuse tests and stats)
        self.n_decodes = 0  # llama_decode calls over its lifetime (round trips per decode over RPC)

    # -- lifecycle ---------------------------------------------------------
    def _load_weights(self, on_progress: Callable[[float], None] | None):
        """The weights, on the compute thread; a file llama.cpp cannot read is named with its log's reason."""
        settings = self.settings
        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers  # llama.cpp's own rule: negative offloads every layer
        mparams.load_mode = C.LLAMA_LOAD_MODE_MMAP if settings.use_mmap else C.LLAMA_LOAD_MODE_NONE
        self._overrides = apply_placement(self.placement, self.path, mparams)  # kept: read during the load
        self.rpc_servers = settings.rpc_servers if self.role == "target" else ()
        self.lost_server: str | None = None  # set when one of them stopped answering
        if self.rpc_servers:  # the servers' devices, then the local GPUs; llama.cpp splits the layers over them
            self._devices = rpc.target_devices(self.rpc_servers, self.path.stat().st_size)  # kept: read at the load
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if on_progress is not None:

            def _progress(value: float, _user: ctypes.c_void_p) -> bool:
                on_progress(float(value))
                return True

            self._progress_cb = C.llama_progress_callback(_progress)  # kept: llama.cpp holds only a pointer
            mparams.progress_callback = self._progress_cb
        log().lines.clear()
        log().model_buffers.clear()
        log().model_layers.clear()
        model = compute(C.llama_model_load_from_file, str(self.path).encode("utf-8"), mparams)
        if not model:
            raise load_failure(self.role, self.path, [line for _, line in log().lines], settings.use_mmap)
        self._model = model
        self.weight_buffer_mib = dict(log().model_buffers)  # e.g. {"CUDA0": 934.4, "CPU_Mapped": 223.4}
        self.weight_buffers = tuple(self.weight_buffer_mib)  # e.g. ("AMX", "CPU_Mapped")
        self.layers_by_device = dict(collections.Counter(log().model_layers))  # e.g. {"RPC0": 14, "RPC1": 14}
        self._vocab = C.llama_model_get_vocab(model)
        self._n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(C.llama_model_n_ctx_train(model))
        if C.llama_model_is_recurrent(model) or C.llama_model_is_hybrid(model):
            kind = "recurrent" if C.llama_model_is_recurrent(model) else "hybrid"
            self.close()
            raise IncompatiblePairError(
                f"{self.role} model {self.path.name} is a {kind} model; its memory cannot drop rejected "
                "tokens, so speculative decoding cannot roll back — use a transformer model"
            )
        return model

    def _create_context(self):
        """One sequence, batches of n_batch, the threads and attention kind of the settings."""
        settings = self.settings
        cparams = C.llama_context_default_params()
        cparams.n_ctx = settings.n_ctx
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = 1
        self.threads = settings.resolved_threads()
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        cparams.flash_attn_type = (
            C.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attention else C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.no_perf = True
        log().context_buffers.clear()
        context = compute(C.llama_init_from_model, self._model, cparams)
        self.context_buffer_mib: dict[str, dict[str, float]] = {}  # {"KV": {"CUDA0": 112.0}, "compute": {...}}
        for kind, buffer, mib in log().context_buffers:
            sizes = self.context_buffer_mib.setdefault(kind, {})
            sizes[buffer] = sizes.get(buffer, 0.0) + mib  # a model with sliding-window layers has two KV caches
        if not context:
            detail = log().last_error()
            self.close()
            raise (OutOfMemoryError if "allocate" in detail else ModelError)(
                f"could not create a context of {settings.n_ctx} tokens for {self.path.name}"
                + (f" (llama.cpp: {detail})" if detail else "")
                + "; lower model.n_ctx"
                + (", offload fewer layers (--n-gpu-layers N)" if self.placement.offload.gpu_blocks else "")
                + " or free memory"
            )
        return context

    @property
    def context_handle(self):
        """llama.cpp's context of this model, for llama.cpp's own tools beside localspec's (the bench's sampler)."""
        return self._ctx

    def close(self) -> None:
        """Free the context and the model (idempotent)."""
        batch = getattr(self, "_batch", None)
        if batch is not None:
            C.llama_batch_free(batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            C.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            C.llama_model_free(self._model)
            self._model = None
            if getattr(self, "rpc_servers", ()) and rpc.lost_server() in self.rpc_servers:
                rpc.forget_lost()  # freed while its messages were dropped: a later model may use the server

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        with contextlib.suppress(Exception):
            self.close()

    # -- LanguageModel -----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def context_size(self) -> int:
        return self._n_ctx

    @property
    def cached_tokens(self) -> Sequence[int]:
        return self._tokens

    @property
    def decode_seconds(self) -> float:
        """Seconds spent inside ``llama_decode`` until the device finished it, and in ``llama_memory_seq_rm``
        (not logits copies or Python)."""
        return self._decode_s

    def extend(self, tokens: Sequence[int], n_logits: int, borrow: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` after the cache; return logits (float32) of the last ``n_logits``: a copy, or
        with ``borrow`` llama.cpp's own output rows where one decode wrote them all (read-only, valid
        until the next decode of this model)."""
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        if n_logits > n:
            raise ValueError(f"asked for {n_logits} logit rows from {n} tokens")
        if len(self._tokens) + n > self._n_ctx:
            raise PromptTooLongError(
                f"{len(self._tokens) + n} tokens do not fit the {self._n_ctx}-token context of "
                f"{self.name}; shorten the prompt or raise model.n_ctx"
            )
        bad = [t for t in tokens if not 0 <= t < self._n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.name} ({self._n_vocab})")
        first_logit = n - n_logits
        one_graph = n <= self.one_row_up_to  # one row at a time, each with its output: the graph of every decode
        chunk = 1 if one_graph else self.rows_per_decode
        borrowed = borrow and n_logits > 0 and first_logit // chunk == (n - 1) // chunk  # one decode writes them all
        out = None if borrowed else np.empty((n_logits, self._n_vocab), dtype=np.float32)
        with self._lock:
            for start in range(0, n, chunk):
                part = tokens[start : start + chunk]
                self._decode(part, start, 0 if one_graph else first_logit)
                rows = start + len(part) - max(start, first_logit)
                if rows > 0:
                    # the requested rows are contiguous in llama.cpp's output buffer
                    ptr = C.llama_get_logits_ith(self._ctx, max(start, first_logit) - start)
                    found = _floats_at(ptr, rows * self._n_vocab).reshape(rows, self._n_vocab)
                    if borrowed:
                        found.flags.writeable = False
                        out = found
                    else:
                        dst = max(start, first_logit) - first_logit
                        out[dst : dst + rows] = found
                self._tokens.extend(part)
        self.n_evaluated += n
        return out

    def _decode(self, part: list[int], offset: int, first_logit: int) -> None:
        batch = self._batch
        pos0 = len(self._tokens)
        batch.n_tokens = len(part)
        for i, token in enumerate(part):
            batch.token[i] = token
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = offset + i >= first_logit
        started = time.perf_counter()
        code = compute(_decode_and_wait, self._ctx, batch)
        self.n_decodes += 1
        self._decode_s += time.perf_counter() - started  # only llama.cpp's own time counts as decode time
        lost = rpc.lost_server() if self.rpc_servers else None
        if lost:  # the logits of this decode are zeros from a server that is gone (localspec's RPC patch)
            self.lost_server = lost
            self._remove_from(pos0)
            raise rpc.RpcServerError(
                f"RPC server {lost} stopped answering mid-reply; the reply ends here and what was written stays. "
                "Start it again: the next request reloads the target"
            )
        if code != 0:
            # llama.cpp restores the memory on failure; make sure we agree with it
            self._remove_from(pos0)
            reason = {1: "no room left in the context (KV cache full)", 2: "aborted"}.get(code, f"error {code}")
            raise ModelError(f"llama_decode failed on {self.name}: {reason}")

    def truncate(self, n_keep: int) -> None:
        """Keep the first ``n_keep`` cached positions; drop the rest from the KV memory."""
        if n_keep >= len(self._tokens):
            return
        started = time.perf_counter()
        with self._lock:
            self._remove_from(n_keep)
        self._decode_s += time.perf_counter() - started

    def _remove_from(self, position: int) -> None:
        if not C.llama_memory_seq_rm(self._memory, 0, position, -1):
            raise ModelError(
                f"{self.name}: llama_memory_seq_rm refused to remove positions {position}.. "
                "(this memory type cannot roll back); speculative decoding is impossible with this model"
            )
        del self._tokens[position:]

    def kv_positions(self) -> tuple[int, int]:
        """(lowest, highest) position llama.cpp holds for the sequence; (-1, -1) when empty."""
        return int(C.llama_memory_seq_pos_min(self._memory, 0)), int(C.llama_memory_seq_pos_max(self._memory, 0))

    def reset(self) -> None:
        """Forget the whole cache."""
        with self._lock:
            C.llama_memory_clear(self._memory, True)
            self._tokens.clear()

    # -- Vocabulary --------------------------------------------------------
    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, special=False)
        return piece

    def _piece(self, token: int, special: bool) -> bytes:
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = C.llama_token_to_piece(self._vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def token_text(self, token: int) -> str:
        """The vocabulary entry itself (as stored in the GGUF), for compatibility checks."""
        return C.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self._vocab, token))

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        capacity = len(data) + 16
        while True:
            buf = (C.llama_token * capacity)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n

    # -- facts about the model -----------------------------------------------
    @property
    def vocab_type(self) -> str:
        code = int(C.llama_vocab_type(self._vocab))
        return _VOCAB_TYPES.get(code, f"type {code}")

    @property
    def bos(self) -> int:
        return int(C.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(C.llama_vocab_eos(self._vocab))

    @property
    def eot(self) -> int:
        return int(C.llama_vocab_eot(self._vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(C.llama_vocab_get_add_bos(self._vocab))

    def special_text(self, token: int) -> str:
        return "" if token < 0 else self._piece(token, special=True).decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        raw = C.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = C.llama_model_meta_val_str(self._model, key.encode(), buf, 4096)
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self._model, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    @property
    def size_bytes(self) -> int:
        return int(C.llama_model_size(self._model))

    @property
    def invariant_rows(self) -> int | None:
        """The largest batch whose rows can equal the same rows decoded one at a time, where llama.cpp's kernels
        bound it: 8 with layers on a CUDA GPU and localspec's CUDA patch (from 9 rows quantized products take
        another kernel family); None where no kernel switch bounds it (the CPU, with localspec's patches)."""
        on_cuda = self.placement.offload.on_cuda
        return runtime.CUDA_INVARIANT_ROWS if on_cuda and runtime.cuda_batch_invariant() else None


@functools.lru_cache(maxsize=64)
def _float_array_type(n: int) -> type:
    return ctypes.c_float * n


def _decode_and_wait(ctx, batch) -> int:
    """``llama_decode``, then wait until its outputs are in (one hand-over to the compute thread for both). A GPU
    or an RPC server computes asynchronously: waiting here makes the decode's seconds the device's, not the
    Python that happens to run next, and only once the logits are in is an RPC server that stopped answering
    on the way known. On a CPU the wait returns at once."""
    code = C.llama_decode(ctx, batch)
    C.llama_synchronize(ctx)
    return code


def _floats_at(ptr, n: int) -> np.ndarray:
    """``n`` floats at ``ptr`` as a numpy view. ``np.ctypeslib.as_array`` builds a ctypes array type
    per call, dearer than copying the logit row; the types are kept here instead."""
    address = ctypes.cast(ptr, ctypes.c_void_p).value
    return np.frombuffer(_float_array_type(n).from_address(address), dtype=np.float32)
