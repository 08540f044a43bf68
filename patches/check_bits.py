"""``make patches-bits``: the speed patches change no bit.

Run before a patch change lands (minutes, not CI). ``make patches-bits`` installs a second venv whose
wheel has only the invariance patches (``PATCH_KIND=invariance``), then runs this with ``--against``
that venv's Python. Each build, in its own process, writes the logits of the same models — the real
pair, the demo pair and one tiny model per weight type the patches touch (:mod:`localspec.llama.tinymodels`)
— for a 300-token context and then 17 tokens decoded one at a time and in batches of 1-17 rows. Every
logit of every row must be the same bits in both builds, and in each build every batched row must equal
the row alone. Exit status 1 names the first model and batch that differ.

    python patches/check_bits.py --against .venv-invariance/bin/python
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PAST = 300  # positions before the probed rows (past 256, where CPU attention kernels change)
SIZES = range(1, 18)
REAL_AND_DEMO = (
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_0-pure.gguf",
    "SmolLM2-135M-Instruct.F32.gguf",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "SmolLM2-135M-Instruct.Q4_0.gguf",
    "gemma-3-270m-q4_k_m.gguf",
)
TEXT = "Speculative decoding must not change a single bit of the output, whichever kernels run. "


def models(folder: Path) -> dict[str, Path]:
    """The real and demo models that are present, and the tiny models in ``folder`` (written once, by the
    build running the check, so both builds read the same files)."""
    from localspec.app.catalog import user_models_dir

    present = {name: user_models_dir() / name for name in REAL_AND_DEMO if (user_models_dir() / name).exists()}
    return present | {path.name: path for path in sorted(folder.glob("tiny.Q*.gguf"))}


def logits_of(path: Path) -> dict[str, np.ndarray]:
    """The probed rows of one model: ``alone`` (17 rows, one per decode) and ``batch<n>`` for n = 1-17."""
    from localspec.llama.model import LlamaModel, LlamaSettings

    model = LlamaModel(path, LlamaSettings(n_ctx=1024))
    try:
        tokens: list[int] = []
        while len(tokens) < PAST + max(SIZES):
            tokens = model.tokenize(TEXT * (1 + len(tokens) // 8))
        past, probe = tokens[:PAST], tokens[PAST : PAST + max(SIZES)]
        model.extend(past, 0)
        rows = {"alone": np.stack([model.extend([t], 1)[0] for t in probe])}
        for size in SIZES:
            model.truncate(PAST)
            rows[f"batch{size}"] = np.array(model.extend(probe[:size], size))
        return rows
    finally:
        model.close()


def dump(out: Path, folder: Path) -> None:
    """Write every model's probed rows to ``out`` (one .npz) with this process's build."""
    arrays = {}
    for name, path in models(folder).items():
        for key, value in logits_of(path).items():
            arrays[f"{name}/{key}"] = value
    np.savez(out, **arrays)


def compare(mine: Path, theirs: Path) -> list[str]:
    """What differs: between the builds, and within each build between a batched row and the row alone."""
    a, b = np.load(mine), np.load(theirs)
    problems = [f"{key}: only in one build" for key in sorted(set(a.files) ^ set(b.files))]
    for key in sorted(set(a.files) & set(b.files)):
        if a[key].view(np.uint32).tobytes() != b[key].view(np.uint32).tobytes():
            problems.append(f"{key}: the builds differ (max |diff| {np.max(np.abs(a[key] - b[key])):.3g})")
    for build, arrays in (("full", a), ("invariance-only", b)):
        for key in arrays.files:
            name, _, part = key.rpartition("/")
            if part.startswith("batch"):
                alone = arrays[f"{name}/alone"][: int(part[5:])]
                if alone.tobytes() != arrays[key].tobytes():
                    problems.append(f"{key}: a batched row differs from the row alone in the {build} build")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python patches/check_bits.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--against", help="the Python of a venv with the other build (make patches-bits: .venv-invariance)"
    )
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)  # one build's side, run in its own process
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        dump(args.dump, args.folder)
        return 0
    if not args.against:
        parser.error("--against PYTHON is required")
    from localspec.app.catalog import user_models_dir
    from localspec.llama.tinymodels import tiny_models

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "tiny"
        tiny_models(user_models_dir() / "SmolLM2-135M-Instruct.F32.gguf", folder)
        files = []
        for python in (sys.executable, args.against):
            out = Path(scratch) / f"{len(files)}.npz"
            subprocess.run([python, __file__, "--dump", str(out), "--folder", str(folder)],
                           check=True)  # fmt: skip
            files.append(out)
        problems = compare(*files)
        count = len(np.load(files[0]).files)
    for line in problems:
        print(line)
    print(f"{count} arrays of logits compared: " + ("all bit-identical" if not problems else f"{len(problems)} differ"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
