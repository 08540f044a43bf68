"""llama.cpp through llama-cpp-python's low-level API. The only module that imports llama_cpp.

One :class:`LlamaModel` owns one model and one context (sequence 0). It
implements the loop's :class:`~localspec.model.LanguageModel` and
:class:`~localspec.model.Vocabulary` protocols:

* ``extend`` submits tokens with ``llama_decode`` in ``n_batch`` chunks and
  asks for logits only on the rows the sampler needs — never ``logits_all``,
  which would store ``n_ctx x n_vocab`` floats and run the output layer on
  every prompt token.
* ``truncate`` removes positions with ``llama_memory_seq_rm`` and checks its
  result: recurrent and hybrid memories cannot drop a suffix, and a silent
  failure there would leave rejected tokens in the cache (DESIGN §2, bug 4).
* Model loads and decodes of every model run on one thread
  (:class:`_ComputeThread`), whichever thread asks for them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .errors import IncompatiblePairError, ModelError, PromptTooLongError

os.environ.setdefault("GGML_LOG_LEVEL", "error")
# llama.cpp's CPU backend computes K-quant matmuls of 8 or more rows with a "tiled" kernel and
# fewer rows with vec_dot; the two round differently, so a verification batch of K >= 7 drafts
# would not score tokens as the target alone does (measured: Qwen2.5 Q4_K_M, max |diff| 0.38 at
# 8+ rows). Off, every batch size computes like a single row. Cost, measured on two cores: single
# tokens and batches up to 9 rows unchanged, 17 rows ~12% slower, prompt evaluation 10-20% slower.
# Read once by llama.cpp at its first matmul; an explicit GGML_CPU_TILED_MM=1 wins (the doctor says so).
TILED_MATMUL_ENV = "GGML_CPU_TILED_MM"
os.environ.setdefault(TILED_MATMUL_ENV, "0")

try:
    import llama_cpp.llama_cpp as C  # noqa: N812 - the C API, named as in llama.cpp's docs
except ImportError as _error:  # pragma: no cover - exercised only on a broken install
    raise ModelError(
        f"llama-cpp-python is not importable ({_error}); run `make install` to build it"
    ) from None

GGUF_MAGIC = b"GGUF"
VOCAB_SIZE_TOLERANCE = 128  # as llama.cpp's speculative example: pads differ between sizes of a family
_VOCAB_TYPES = {0: "none", 1: "SentencePiece (SPM)", 2: "byte-level BPE", 3: "WordPiece", 4: "Unigram (T5)", 5: "RWKV", 6: "PLaMo-2"}


# ----------------------------------------------------------------------
# one thread for llama.cpp's computations
# ----------------------------------------------------------------------
class _ComputeThread:
    """The one OS thread that runs llama.cpp's computations (model loads, decodes), whoever asks.

    The CPU backend is built with OpenMP, and libgomp keeps a pool of worker
    threads for every thread that ever opened a parallel region. Once the
    threads it manages outnumber the CPUs, every barrier stops spinning and
    sleeps in the kernel instead — and a decode has hundreds of barriers.
    Measured on two cores: a pair loaded on one thread and decoded on
    another (the UI loads at start-up and replies on Gradio's worker threads)
    decoded the F32 target at 74 ms per token instead of 31, and the AMX
    draft at 97 ms instead of 8; the UI showed 0.8x where the benchmark
    showed 2x. Callers wait for the result as if they had called llama.cpp
    themselves; the hand-over costs about 0.1 ms per decode (a draft token: ~8 ms).
    """

    def __init__(self) -> None:
        self._ident: int | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="llama-compute", initializer=self._claim
        )

    def _claim(self) -> None:
        self._ident = threading.get_ident()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the compute thread; its result or its exception."""
        if threading.get_ident() == self._ident:
            return fn(*args)
        future = self._executor.submit(fn, *args)
        try:
            return future.result()
        except KeyboardInterrupt:
            # as with a direct call, llama.cpp finishes first, so the cache bookkeeping is never behind it
            concurrent.futures.wait([future])
            raise


_COMPUTE = _ComputeThread()


# ----------------------------------------------------------------------
# logging: llama.cpp writes to stderr unless given a callback
# ----------------------------------------------------------------------
class _LlamaLog:
    """Keeps llama.cpp's recent log lines so load errors can quote them; prints only when verbose."""

    def __init__(self) -> None:
        self.lines: deque[tuple[int, str]] = deque(maxlen=200)
        self.model_buffers: list[str] = []  # buffer types the last loaded model's weights went to
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
        if "model buffer size" in line:  # e.g. "load_tensors:          AMX model buffer size =    95.34 MiB"
            self.model_buffers.append(line.split(":", 1)[-1].split("model buffer")[0].strip())
        if self.verbose and level >= 3:
            sys.stderr.write(line)

    def last_error(self) -> str:
        """The most recent line that looks like an error, without llama.cpp's function prefix."""
        for level, line in reversed(self.lines):
            low = line.lower()
            if "error" in low or "failed" in low or "invalid" in low or "not within" in low:
                text = line.strip()
                return text.split(": ", 1)[1] if ": " in text else text
        return ""


_LOG = _LlamaLog()
C.llama_backend_init()


def system_info() -> str:
    """llama.cpp's feature line, e.g. ``CPU : AVX2 = 1 | ... | LLAMAFILE = 1``."""
    return C.llama_print_system_info().decode("utf-8", errors="replace").strip()


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


def tiled_matmul_enabled() -> bool:
    """Whether llama.cpp's batch-size-dependent tiled K-quant matmul is on in this process."""
    value = os.environ.get(TILED_MATMUL_ENV, "1").strip()
    return value not in ("0", "")


def llama_cpp_version() -> str:
    import llama_cpp

    return getattr(llama_cpp, "__version__", "unknown")


def gpu_offload_supported() -> bool:
    return bool(C.llama_supports_gpu_offload())


# ----------------------------------------------------------------------
# settings and file checks
# ----------------------------------------------------------------------
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
    hint = "run `localspec models prepare` for the demo pair, or set model.%s in config.yaml" % role
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

        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else 999_999
        mparams.load_mode = C.LLAMA_LOAD_MODE_MMAP if settings.use_mmap else C.LLAMA_LOAD_MODE_NONE
        if settings.extra_buffers is None:
            self.placement = weight_placement(role)
        else:
            state = "on" if settings.extra_buffers else "off"
            self.placement = WeightPlacement(settings.extra_buffers, False, f"extra buffers {state} (chosen for batch invariance)")
        mparams.use_extra_bufts = self.placement.extra_buffers
        if on_progress is not None:

            def _progress(value: float, _user: ctypes.c_void_p) -> bool:
                on_progress(float(value))
                return True

            self._progress_cb = C.llama_progress_callback(_progress)
            mparams.progress_callback = self._progress_cb
        _LOG.lines.clear()
        _LOG.model_buffers.clear()
        self._model = _COMPUTE.run(C.llama_model_load_from_file, str(self.path).encode("utf-8"), mparams)
        if not self._model:
            detail = _LOG.last_error()
            raise ModelError(
                f"{role} model {self.path} could not be loaded"
                + (f" (llama.cpp: {detail})" if detail else "")
                + "; the file is truncated or corrupt — re-download it or run `localspec models prepare`"
            )
        self.weight_buffers = tuple(_LOG.model_buffers)  # e.g. ("AMX", "CPU_Mapped")
        self._vocab = C.llama_model_get_vocab(self._model)
        self._n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        if C.llama_model_is_recurrent(self._model) or C.llama_model_is_hybrid(self._model):
            kind = "recurrent" if C.llama_model_is_recurrent(self._model) else "hybrid"
            self.close()
            raise IncompatiblePairError(
                f"{role} model {self.path.name} is a {kind} model; its memory cannot drop rejected "
                "tokens, so speculative decoding cannot roll back — use a transformer model"
            )
        n_ctx_train = int(C.llama_model_n_ctx_train(self._model))
        cparams = C.llama_context_default_params()
        cparams.n_ctx = settings.n_ctx
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = 1
        threads = settings.resolved_threads()
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = (
            C.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attention else C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.no_perf = True
        self._ctx = _COMPUTE.run(C.llama_init_from_model, self._model, cparams)
        if not self._ctx:
            detail = _LOG.last_error()
            self.close()
            raise ModelError(
                f"could not create a context of {settings.n_ctx} tokens for {self.path.name}"
                + (f" (llama.cpp: {detail})" if detail else "")
                + "; lower model.n_ctx or free memory"
            )
        self._memory = C.llama_get_memory(self._ctx)
        self._n_ctx = int(C.llama_n_ctx(self._ctx))  # llama.cpp rounds up to a multiple of 256
        self._n_batch = int(C.llama_n_batch(self._ctx))  # and caps the batch at the requested n_ctx
        self.n_ctx_train = n_ctx_train
        self.threads = threads
        self._batch = C.llama_batch_init(self._n_batch, 0, 1)
        # one row per decode only where the AMX buffer really holds weights (see weight_placement)
        self.rows_per_decode = 1 if self.placement.one_row_per_decode and "AMX" in self.weight_buffers else self._n_batch
        self._tokens: list[int] = []
        self._pieces: dict[int, bytes] = {}
        self._decode_s = 0.0
        self.n_evaluated = 0  # tokens evaluated over the model's lifetime (KV-reuse tests and stats)

    # -- lifecycle ---------------------------------------------------------
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

    def __enter__(self) -> "LlamaModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """Seconds spent inside ``llama_decode`` and ``llama_memory_seq_rm`` (not logits copies or Python)."""
        return self._decode_s

    def extend(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Evaluate ``tokens`` after the cache; return logits (float32) of the last ``n_logits``."""
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
        out = np.empty((n_logits, self._n_vocab), dtype=np.float32)
        first_logit = n - n_logits
        chunk = self.rows_per_decode
        with self._lock:
            for start in range(0, n, chunk):
                part = tokens[start : start + chunk]
                self._decode(part, start, first_logit)
                rows = start + len(part) - max(start, first_logit)
                if rows > 0:
                    # the requested rows are contiguous in llama.cpp's output buffer: one copy
                    ptr = C.llama_get_logits_ith(self._ctx, max(start, first_logit) - start)
                    dst = max(start, first_logit) - first_logit
                    out[dst : dst + rows] = np.ctypeslib.as_array(ptr, shape=(rows, self._n_vocab))
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
        code = _COMPUTE.run(C.llama_decode, self._ctx, batch)
        self._decode_s += time.perf_counter() - started  # only llama.cpp's own time counts as decode time
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

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 16
        while True:
            buf = (C.llama_token * capacity)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

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

    def vocab_texts(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, str]]:
        for token in range(start, self._n_vocab if stop is None else min(stop, self._n_vocab)):
            yield token, self.token_text(token)


class ReferenceGenerator:
    """llama-cpp-python's own high-level generation, as an outside reference for ``localspec bench``.

    The same target file, threads and context, generated greedily through
    ``llama_cpp.Llama.generate`` — alone, or with its built-in prompt-lookup
    ``draft_model`` (``LlamaPromptLookupDecoding``), which is what a user of
    llama-cpp-python gets without localspec. Lives here because this is the
    only module that imports llama_cpp.
    """

    def __init__(self, path: str | Path, settings: LlamaSettings, num_pred_tokens: int = 10, max_ngram_size: int = 2) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.lookup = LlamaPromptLookupDecoding(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
        threads = settings.resolved_threads()
        original = C.llama_model_default_params

        def params():  # same buffer-type choice as LocalSpec's target (see weight_placement)
            value = original()
            value.use_extra_bufts = weight_placement("target").extra_buffers
            return value

        C.llama_model_default_params = params
        try:
            # draft_model is given at construction (it turns on logits_all, as the library requires);
            # loaded and run on the compute thread, as localspec's own models are
            self.llm = _COMPUTE.run(lambda: Llama(
                model_path=str(path), n_ctx=settings.n_ctx, n_batch=settings.n_batch, n_threads=threads,
                n_threads_batch=threads, n_gpu_layers=settings.n_gpu_layers, flash_attn=settings.flash_attention,
                draft_model=self.lookup, verbose=False,
            ))  # fmt: skip
        finally:
            C.llama_model_default_params = original
        self._vocab = C.llama_model_get_vocab(self.llm.model)

    def generate(self, tokens: Sequence[int], max_tokens: int, prompt_lookup: bool) -> tuple[int, float]:
        """Greedy generation; returns (tokens generated, seconds from the first to the last token).

        Timing starts at the first token, so prompt evaluation is excluded as
        in localspec's own decode rate; that token is not counted either.
        """
        return _COMPUTE.run(self._generate, tokens, max_tokens, prompt_lookup)

    def _generate(self, tokens: Sequence[int], max_tokens: int, prompt_lookup: bool) -> tuple[int, float]:
        self.llm.draft_model = self.lookup if prompt_lookup else None
        n = 0
        first = last = 0.0
        for token in self.llm.generate(list(tokens), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            now = time.perf_counter()
            if C.llama_vocab_is_eog(self._vocab, token):
                break
            n += 1
            if n == 1:
                first = now
            last = now
            if n >= max_tokens:
                break
        return max(n - 1, 0), last - first

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.llm.close()


def first_token_mismatch(target: LlamaModel, draft: LlamaModel) -> tuple[int, str, str] | None:
    """The first token id whose text differs between the two vocabularies, if any."""
    for token in range(min(target.vocab_size, draft.vocab_size)):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            return token, t_text, d_text
    return None


def check_pair(target: LlamaModel, draft: LlamaModel) -> None:
    """Refuse a draft whose tokens do not mean the same as the target's (DESIGN §4).

    Checks every token text both vocabularies have, the vocabulary type, the
    size difference and the BOS/EOS/EOT ids. The message names the first
    differing token id with both texts, so the user sees *why*.
    """
    pair = f"draft {draft.name} cannot draft for target {target.name}"
    vocabs = (
        f"vocabularies: {target.vocab_type} with {target.vocab_size} tokens vs "
        f"{draft.vocab_type} with {draft.vocab_size}"
    )
    fix = "pick a draft with the same tokenizer (same model family)"
    mismatch = first_token_mismatch(target, draft)
    if mismatch is not None:
        token, t_text, d_text = mismatch
        raise IncompatiblePairError(
            f"{pair}: token {token} is {t_text!r} in the target but {d_text!r} in the draft ({vocabs}); {fix}"
        )
    if target.vocab_type != draft.vocab_type:
        raise IncompatiblePairError(f"{pair}: vocabulary types differ ({vocabs}); {fix}")
    gap = abs(target.vocab_size - draft.vocab_size)
    if gap > VOCAB_SIZE_TOLERANCE:
        raise IncompatiblePairError(
            f"{pair}: vocabulary sizes differ by {gap}, more than {VOCAB_SIZE_TOLERANCE} ({vocabs}); {fix}"
        )
    for label, a, b in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos), ("EOT", target.eot, draft.eot)):
        if a != b:
            raise IncompatiblePairError(f"{pair}: {label} token ids differ ({a} vs {b}); {fix}")


_FTYPES = {"F32": "LLAMA_FTYPE_ALL_F32", "F16": "LLAMA_FTYPE_MOSTLY_F16", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
           "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}  # fmt: skip


def quantize(source: Path, destination: Path, kind: str, threads: int = 0) -> None:
    """Convert a GGUF to another weight type with ``llama_model_quantize`` (requantizing allowed)."""
    if kind not in _FTYPES:
        raise ModelError(f"weight type {kind!r} is not supported; use one of {', '.join(_FTYPES)}")
    params = C.llama_model_quantize_default_params()
    params.ftype = getattr(C, _FTYPES[kind])
    params.allow_requantize = True
    params.nthread = threads
    _LOG.lines.clear()
    code = C.llama_model_quantize(str(source).encode(), str(destination).encode(), ctypes.byref(params))
    if code != 0:
        detail = _LOG.last_error()
        raise ModelError(f"converting {source.name} to {kind} failed" + (f" (llama.cpp: {detail})" if detail else ""))
