"""Write a Qwen2 GGUF with random weights of a real model's shapes: real kernel costs and real batch
behaviour without carrying the weights (a 7B file is 4.4 GB; its metadata, the template, is 6 MB).

    python gpu/randgguf.py TEMPLATE OUT --shape 7b [--qtype Q4_K | --qtype Q4_0 --pure]

TEMPLATE is a GGUF with a real model's metadata and no tensors (``gpu/make_template.py``). The default
layout is llama.cpp's Q4_K_M (Q6_K for the output matrix and for attn_v/ffn_down in its "more bits"
layers); ``--qtype Q4_0 --pure`` is the default pair's draft. Weights are random bytes drawn once and
tiled (64 MiB of blocks per type and width, each block's fp16 scales set so every weight is finite and
of a sane size), so a 32B file is written at about the speed of a copy. Needs numpy and gguf-py (the
sdist's vendor/llama.cpp/gguf-py).
"""

from __future__ import annotations

import argparse
import functools
import sys

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
# byte offsets of the fp16 scale fields inside one block, and the spread of a block's integer weights
SCALES = {T.Q4_0: [0], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q6_K: [208]}
SPREAD = {T.Q4_0: 4.6, T.Q8_0: 74.0, T.Q4_K: 170.0, T.Q6_K: 300.0}
# layers, embedding, feed-forward, heads, kv heads, vocabulary: Qwen2.5's published shapes
SHAPES = {
    "0.5b": (24, 896, 4864, 14, 2, 151936),
    "1.5b": (28, 1536, 8960, 12, 2, 151936),
    "7b": (28, 3584, 18944, 28, 4, 152064),
    "32b": (64, 5120, 27648, 40, 8, 152064),
}
POOL_BYTES = 64 << 20


@functools.cache
def block_pool(qtype, scale: float, seed: int) -> np.ndarray:
    """64 MiB of random blocks of ``qtype`` (rows of block bytes) with their fp16 scales set for weights of
    about ``scale``; tensors are tiled from it, so writing one costs a copy."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(POOL_BYTES // block_bytes, block_bytes), dtype=np.uint8)
    if qtype == T.Q6_K:
        raw[:, 192:208] = raw[:, 192:208] % 31 + 1  # int8 sub-block scales: positive, small
    d = scale / SPREAD[qtype]
    for at, value in zip(SCALES[qtype], (d, d * 7.5)):  # K-quants: d, then dmin (centres the weights)
        raw[:, at : at + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return raw


def random_tensor(offset: int, name: str, shape: tuple[int, ...], qtype, seed: int) -> np.ndarray:
    """The raw array of one tensor (numpy order: rows, cols), its blocks tiled from a pool starting at
    ``offset``; norms are ones and biases zeros."""
    if qtype == T.F32:
        return np.full(shape, 0.0 if name.endswith("bias") else 1.0, dtype=np.float32)
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    assert cols % block == 0, (shape, qtype)
    pool = block_pool(qtype, float(1.0 / np.sqrt(cols)), seed)
    raw = np.empty((rows * cols // block, block_bytes), dtype=np.uint8)
    at, start = 0, offset % len(pool)
    while at < len(raw):  # the pool from ``start``, then from its beginning, as often as it takes
        take = min(len(pool) - start, len(raw) - at)
        raw[at : at + take] = pool[start : start + take]
        at, start = at + take, 0
    return raw.reshape(rows, cols // block * block_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("template")
    parser.add_argument("out")
    parser.add_argument("--shape", choices=SHAPES, required=True)
    parser.add_argument("--qtype", default="Q4_K", choices=("Q4_K", "Q4_0", "Q8_0"))
    parser.add_argument(
        "--pure", action="store_true", help="every matrix in --qtype (no Q6_K for attn_v/ffn_down/output)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layers, embd, ff, heads, kv_heads, vocab = SHAPES[args.shape]
    reader = gguf.GGUFReader(args.template)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.out, arch)
    file_type = {
        "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
        "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[args.qtype]  # what llama.cpp's description names
    shape_keys = {"general.file_type": int(file_type), f"{arch}.block_count": layers, f"{arch}.embedding_length": embd,
                  f"{arch}.feed_forward_length": ff, f"{arch}.attention.head_count": heads,
                  f"{arch}.attention.head_count_kv": kv_heads}  # fmt: skip
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = shape_keys.get(key, field.contents())
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") and len(value) < vocab:  # pad to the vocab
            pad = (
                [f"[PAD{i}]" for i in range(len(value), vocab)]
                if key.endswith("tokens")
                else [4] * (vocab - len(value))
            )
            value = list(value) + pad
        writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)

    qtype = T[args.qtype]
    kv = embd // heads * kv_heads
    wide = qtype if args.pure else T.Q6_K
    tensors = [("token_embd.weight", (vocab, embd), qtype)]
    for i in range(layers):
        more = i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2  # llama.cpp's use_more_bits
        p = f"blk.{i}."
        tensors += [(p + "attn_norm.weight", (embd,), T.F32),
                    (p + "attn_q.weight", (embd, embd), qtype), (p + "attn_q.bias", (embd,), T.F32),
                    (p + "attn_k.weight", (kv, embd), qtype), (p + "attn_k.bias", (kv,), T.F32),
                    (p + "attn_v.weight", (kv, embd), wide if more else qtype), (p + "attn_v.bias", (kv,), T.F32),
                    (p + "attn_output.weight", (embd, embd), qtype),
                    (p + "ffn_norm.weight", (embd,), T.F32),
                    (p + "ffn_gate.weight", (ff, embd), qtype), (p + "ffn_up.weight", (ff, embd), qtype),
                    (p + "ffn_down.weight", (embd, ff), wide if more else qtype)]  # fmt: skip
    tensors += [("output_norm.weight", (embd,), T.F32), ("output.weight", (vocab, embd), wide)]
    for index, (name, shape, kind) in enumerate(tensors):
        data = random_tensor(index * 4099, name, shape, kind, args.seed)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out} ({args.shape}, {args.qtype}{' pure' if args.pure else ''})", file=sys.stderr)


if __name__ == "__main__":
    main()
