"""``python -m localspec.bench cold``: the first reply of a fresh process, against the target alone.

Every run is a new ``localspec generate --json`` process, so each reply is the
first its process makes: what a one-shot CLI call, a restarted UI or a new
server pays. Per repeat and prompt, in turn (interleaved, so a background
process or the page cache favours none):

* ``target alone``: ``--draft none``;
* ``default``: the default config, with what earlier processes learnt (a
  cache folder the bench keeps for its runs, seeded by one untimed run per
  prompt: the state after using the app once);
* ``nothing learnt``: the default config with an empty cache folder each run,
  what every fresh process did before learnt state was kept.

The rate is the reply's tokens over its decode seconds, as ``localspec bench``
reports it; the report gives medians and each variant's share of the target
alone's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from localspec.bench.markdown import table

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
VARIANTS = ("target alone", "default", "nothing learnt")
PROMPTS = ("chat", "essay", "code")


@dataclass
class ColdRun:
    variant: str
    prompt: str
    repeat: int
    tokens: int
    tokens_per_second: float  # over the reply's decode seconds
    process_s: float  # the whole process: start, load, reply


def run_once(variant: str, prompt: str, text: str, repeat: int, max_tokens: int, learnt: Path,
             pair_args: list[str]) -> ColdRun:  # fmt: skip
    """One fresh ``localspec generate`` process for ``variant``."""
    command = [sys.executable, "-m", "localspec", "generate", "--json", "--max-tokens", str(max_tokens),
               "--seed", str(1000 + repeat), *pair_args]  # fmt: skip
    command += ["--draft", "none"] if variant == "target alone" else ["--remember"]
    with tempfile.TemporaryDirectory(prefix="localspec-cold-") as empty:
        cache = learnt if variant == "default" else Path(empty)
        env = {**os.environ, "LOCALSPEC_CACHE": str(cache)}
        started = time.perf_counter()
        done = subprocess.run([*command, text], env=env, capture_output=True, text=True, timeout=900)
        process_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"`localspec generate` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    stats = json.loads(done.stdout.strip().splitlines()[-1])["stats"]
    return ColdRun(variant, prompt, repeat, stats["n_tokens"], stats["tokens_per_second"], process_s)


def summary(runs: list[ColdRun]) -> list[dict]:
    """Per prompt: each variant's median tok/s and its share of the target alone's."""
    rows = []
    for prompt in dict.fromkeys(r.prompt for r in runs):
        row: dict = {"prompt": prompt}
        for variant in VARIANTS:
            mine = [r for r in runs if r.prompt == prompt and r.variant == variant]
            row[variant] = statistics.median(r.tokens_per_second for r in mine) if mine else None
            row[f"{variant} tokens"] = statistics.median(r.tokens for r in mine) if mine else None
        alone = row["target alone"]
        for variant in VARIANTS[1:]:
            row[f"{variant} ratio"] = row[variant] / alone if alone and row[variant] else None
        rows.append(row)
    return rows


def render(rows: list[dict], header: str) -> str:
    columns = ["prompt", "target alone tok/s", "default tok/s", "default / alone", "nothing learnt tok/s",
               "nothing learnt / alone"]  # fmt: skip
    cells = [[r["prompt"], f"{r['target alone']:.1f}", f"{r['default']:.1f}", f"{r['default ratio']:.2f}",
              f"{r['nothing learnt']:.1f}", f"{r['nothing learnt ratio']:.2f}"] for r in rows]  # fmt: skip
    return header + "\n\n" + table(columns, cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.bench cold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default=",".join(PROMPTS), help="bench prompts by name, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default=None, help="also write every run as JSON here")
    args, pair_args = parser.parse_known_args(argv)  # the rest (--pair, --threads ...) go to generate
    known = {p["name"]: p["prompt"] for p in yaml.safe_load(PROMPTS_FILE.read_text())}
    names = [name.strip() for name in args.prompts.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"no bench prompt {', '.join(unknown)}; choose from {', '.join(known)}")
    runs: list[ColdRun] = []
    with tempfile.TemporaryDirectory(prefix="localspec-learnt-") as folder:
        learnt = Path(folder)
        for name in names:  # what one earlier use of the app leaves behind
            run_once("default", name, known[name], 0, args.max_tokens, learnt, pair_args)
        for repeat in range(1, args.repeats + 1):
            for name in names:
                for variant in VARIANTS:
                    run = run_once(variant, name, known[name], repeat, args.max_tokens, learnt, pair_args)
                    runs.append(run)
                    print(f"{name} {variant} #{repeat}: {run.tokens} tokens, {run.tokens_per_second:.1f} tok/s, "
                          f"process {run.process_s:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
    header = (f"`python -m localspec.bench cold {' '.join(argv if argv is not None else sys.argv[1:])}`: a fresh "
              f"`localspec generate` per reply, up to {args.max_tokens} tokens, {args.repeats} repeats; "
              "medians")  # fmt: skip
    print(render(summary(runs), header))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0
