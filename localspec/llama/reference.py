"""llama-cpp-python's own high-level generation, as an outside reference for the benchmark."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from localspec.llama.model import LlamaSettings, choose_placement
from localspec.llama.placement import apply_placement
from localspec.llama.runtime import C, compute


class ReferenceGenerator:
    """llama-cpp-python's own high-level generation, as an outside reference for ``localspec bench``.

    The same target file, threads and context, generated greedily through
    ``llama_cpp.Llama.generate`` — alone, or with its built-in prompt-lookup
    ``draft_model`` (``LlamaPromptLookupDecoding``), which is what a user of
    llama-cpp-python gets without localspec. Lives here because this is the
    only module that imports llama_cpp.
    """

    def __init__(
        self, path: str | Path, settings: LlamaSettings, num_pred_tokens: int = 10, max_ngram_size: int = 2
    ) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.lookup = LlamaPromptLookupDecoding(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
        threads = settings.resolved_threads()
        original = C.llama_model_default_params
        placement = choose_placement(settings, "target", Path(path))
        kept = []  # the override list, alive until the load is done

        def params():  # same buffer-type choice as LocalSpec's target (see choose_placement)
            value = original()
            kept.append(apply_placement(placement, path, value))
            return value

        C.llama_model_default_params = params
        try:
            # draft_model is given at construction (it turns on logits_all, as the library requires);
            # loaded and run on the compute thread, as localspec's own models are
            self.llm = compute(lambda: Llama(
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
        return compute(self._generate, tokens, max_tokens, prompt_lookup)

    def _generate(self, tokens: Sequence[int], max_tokens: int, prompt_lookup: bool) -> tuple[int, float]:
        self.llm.draft_model = self.lookup if prompt_lookup else None
        n = 0
        first = last = 0.0
        for token in self.llm.generate(
            list(tokens), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        ):
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


class LlamaCppSampler:
    """llama.cpp's own sampler chain, as llama-server runs it for every token, on a model's latest output row.

    At ``temperature`` 0 the chain is greedy; above it, temperature and then the draw over the whole
    vocabulary: the distribution localspec samples from (llama-server's default chain would first keep
    the top 40). The bench times it beside localspec's own draw on the same row.
    """

    def __init__(self, temperature: float, seed: int = 0) -> None:
        self._chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        if temperature > 0:
            C.llama_sampler_chain_add(self._chain, C.llama_sampler_init_temp(temperature))
            C.llama_sampler_chain_add(self._chain, C.llama_sampler_init_dist(seed))
        else:
            C.llama_sampler_chain_add(self._chain, C.llama_sampler_init_greedy())

    def sample(self, model) -> int:
        """A token drawn from ``model``'s (a :class:`~localspec.llama.model.LlamaModel`) last output row."""
        return int(C.llama_sampler_sample(self._chain, model.context_handle, -1))

    def close(self) -> None:
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None
