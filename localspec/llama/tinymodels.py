"""Tiny random-weight models, one per weight type localspec's patches touch: the kernel tests
(tests/test_kernels.py) and the patch check (``make patches-bits``) run every kernel on them in seconds.

A two-layer llama-architecture model, 256 wide, written as F32 with gguf-py and quantized by llama.cpp
with every matrix in one type (``pure``). The widths are multiples of 256 so K-quants stay K-quants;
the tokenizer is borrowed from a real GGUF so text can be tokenized.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from localspec.llama.quantize import quantize

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
SHAPE = {"block_count": 2, "embedding_length": 256, "feed_forward_length": 768, "head_count": 4, "head_count_kv": 2}


def write_tiny_model(tokenizer_source: Path, out: Path, seed: int = 7) -> None:
    """A two-layer llama-architecture GGUF with random F32 weights and ``tokenizer_source``'s tokenizer."""
    reader = gguf.GGUFReader(tokenizer_source)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_block_count(SHAPE["block_count"])
    writer.add_context_length(2048)
    writer.add_embedding_length(SHAPE["embedding_length"])
    writer.add_feed_forward_length(SHAPE["feed_forward_length"])
    writer.add_head_count(SHAPE["head_count"])
    writer.add_head_count_kv(SHAPE["head_count_kv"])
    writer.add_rope_dimension_count(SHAPE["embedding_length"] // SHAPE["head_count"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)

    rng = np.random.default_rng(seed)
    width, ff = SHAPE["embedding_length"], SHAPE["feed_forward_length"]
    kv_width = width // SHAPE["head_count"] * SHAPE["head_count_kv"]

    def matrix(rows: int, columns: int) -> np.ndarray:  # rows x columns: GGUF's ne = [columns, rows]
        return (rng.standard_normal((rows, columns)) / np.sqrt(columns)).astype(np.float32)

    writer.add_tensor("token_embd.weight", matrix(n_vocab, width))
    writer.add_tensor("output_norm.weight", np.ones(width, np.float32))
    for layer in range(SHAPE["block_count"]):
        name = f"blk.{layer}."
        writer.add_tensor(name + "attn_norm.weight", np.ones(width, np.float32))
        writer.add_tensor(name + "attn_q.weight", matrix(width, width))
        writer.add_tensor(name + "attn_k.weight", matrix(kv_width, width))
        writer.add_tensor(name + "attn_v.weight", matrix(kv_width, width))
        writer.add_tensor(name + "attn_output.weight", matrix(width, width))
        writer.add_tensor(name + "ffn_norm.weight", np.ones(width, np.float32))
        writer.add_tensor(name + "ffn_gate.weight", matrix(ff, width))
        writer.add_tensor(name + "ffn_up.weight", matrix(ff, width))
        writer.add_tensor(name + "ffn_down.weight", matrix(width, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_models(tokenizer_source: Path, folder: Path, types: tuple[str, ...] = TYPES) -> dict[str, Path]:
    """One tiny model per weight type in ``folder`` (written and quantized anew), by type."""
    folder.mkdir(parents=True, exist_ok=True)
    f32 = folder / "tiny.F32.gguf"
    write_tiny_model(tokenizer_source, f32)
    models = {}
    for kind in types:
        models[kind] = folder / f"tiny.{kind}.gguf"
        quantize(f32, models[kind], kind, pure=True)
    return models


def matrix_types(path: Path) -> set[str]:
    """The weight types of a GGUF's matrices."""
    return {tensor.tensor_type.name for tensor in gguf.GGUFReader(path).tensors if len(tensor.shape) == 2}
