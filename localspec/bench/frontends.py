"""``python -m localspec.bench frontends``: the terminal chat and the API against ``localspec generate``.

The same prompt, seed and settings go, in turn per repeat and variant
(interleaved), through three front ends on the same pair:

* ``generate``: a ``localspec generate --json`` process per reply (the engine
  alone, nothing drawn; it resumes what earlier processes learnt);
* ``chat``: one ``localspec chat`` in a real pseudo-terminal, its
  conversation reset before each reply;
* ``api``: one ``localspec serve``, streamed through the ``openai`` client.

Each reply's rate is the engine's own (tokens over decode seconds, as each
front end reports it): a front end that costs the machine anything while it
streams shows up as a slower engine. The report gives medians and each front
end's share of ``generate``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from localspec.bench.markdown import table

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
VARIANTS = ("target-only", "rejection")  # the mode each variant runs
TEMPERATURE = 0.7  # every front end is told it, so none runs on a default of its own
FRONT_ENDS = ("generate", "chat", "api")
STATS_LINE = re.compile(r"\[(\d+) tokens · ([\d.]+) tok/s")
PROMPT = "you>"  # prompt_toolkit draws the prompt's trailing space as a cursor move


@dataclass
class FrontEndRun:
    front_end: str
    variant: str
    repeat: int
    tokens: int
    tokens_per_second: float


def by_generate(prompt: str, variant: str, seed: int, max_tokens: int, flags: list[str]) -> FrontEndRun:
    command = [sys.executable, "-m", "localspec", "generate", "--json", "--mode", variant, "--seed", str(seed),
               "--temperature", str(TEMPERATURE), "--max-tokens", str(max_tokens), *flags, prompt]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"`localspec generate` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    stats = json.loads(done.stdout.strip().splitlines()[-1])["stats"]
    return FrontEndRun("generate", variant, 0, stats["n_tokens"], stats["tokens_per_second"])


class Chat:
    """One ``localspec chat`` in a pseudo-terminal (pexpect), driven as a person types."""

    def __init__(self, max_tokens: int, flags: list[str]) -> None:
        import pexpect

        self.child = pexpect.spawn(sys.executable, ["-m", "localspec", "chat", "--max-tokens", str(max_tokens), *flags],
                                   env={**os.environ, "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1"},
                                   encoding="utf-8", codec_errors="replace", dimensions=(50, 160),
                                   timeout=900)  # fmt: skip
        self.child.expect_exact(PROMPT)

    def command(self, line: str) -> None:
        self.child.sendline(line)
        self.child.expect_exact(PROMPT)

    def reply(self, prompt: str, variant: str, seed: int) -> FrontEndRun:
        self.command("/reset")
        self.command(f"/temp {TEMPERATURE}")
        self.command(f"/mode {variant}")
        self.command(f"/seed {seed}")
        self.child.sendline(prompt)
        self.child.expect(STATS_LINE)
        tokens, rate = int(self.child.match.group(1)), float(self.child.match.group(2))
        self.child.expect_exact(PROMPT)
        return FrontEndRun("chat", variant, 0, tokens, rate)

    def close(self) -> None:
        import pexpect

        if self.child.isalive():
            self.child.sendline("/quit")
            self.child.expect(pexpect.EOF, timeout=60)
        self.child.close(force=True)


class Server:
    """One ``localspec serve`` on a free loopback port, and the ``openai`` client that talks to it."""

    def __init__(self, flags: list[str]) -> None:
        import openai

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.process = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", str(port), *flags],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        for line in self.process.stdout:
            if line.startswith("localspec API: "):
                break
        else:
            raise SystemExit(f"`localspec serve` exited with {self.process.wait()} before it was ready")
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=900)

    def reply(self, prompt: str, variant: str, seed: int, max_tokens: int) -> FrontEndRun:
        stream = self.client.chat.completions.create(
            model="localspec", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, seed=seed,
            temperature=TEMPERATURE, stream=True, extra_body={"mode": variant},
        )  # fmt: skip
        tokens, rate = 0, 0.0
        for chunk in stream:
            extra = (chunk.model_extra or {}).get("localspec", {})
            tokens += len(extra.get("tokens", []))
            rate = extra.get("tokens_per_second", rate)
        return FrontEndRun("api", variant, 0, tokens, rate)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def summary(runs: list[FrontEndRun]) -> list[dict]:
    rows = []
    for variant in VARIANTS:
        row: dict = {"variant": variant}
        for end in FRONT_ENDS:
            mine = [r.tokens_per_second for r in runs if r.variant == variant and r.front_end == end]
            row[end] = statistics.median(mine) if mine else None
        for end in FRONT_ENDS[1:]:
            row[f"{end} ratio"] = row[end] / row["generate"] if row[end] and row["generate"] else None
        rows.append(row)
    return rows


def render(rows: list[dict], header: str) -> str:
    columns = ["variant", "generate tok/s", "chat tok/s", "chat / generate", "API tok/s", "API / generate"]
    cells = [[r["variant"], f"{r['generate']:.1f}", f"{r['chat']:.1f}", f"{r['chat ratio']:.2f}", f"{r['api']:.1f}",
              f"{r['api ratio']:.2f}"] for r in rows]  # fmt: skip
    return header + "\n\n" + table(columns, cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.bench frontends", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="essay", help="a bench prompt's name (localspec/bench/prompts.yaml)")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default=None, help="also write every run as JSON here")
    args, flags = parser.parse_known_args(argv)  # the rest (--pair, --threads ...) go to every front end
    prompts = {p["name"]: p["prompt"] for p in yaml.safe_load(PROMPTS_FILE.read_text())}
    if args.prompt not in prompts:
        raise SystemExit(f"no bench prompt {args.prompt!r}; choose from {', '.join(prompts)}")
    prompt = " ".join(prompts[args.prompt].split())  # one line: the terminal sends on Enter
    runs: list[FrontEndRun] = []
    chat, server = Chat(args.max_tokens, flags), Server(flags)
    try:
        for repeat in range(args.repeats + 1):  # round 0 warms up (the page cache, the controllers) and is not kept
            for variant in VARIANTS:
                seed = 1000 + repeat
                for run in (by_generate(prompt, variant, seed, args.max_tokens, flags),
                            chat.reply(prompt, variant, seed),
                            server.reply(prompt, variant, seed, args.max_tokens)):  # fmt: skip
                    run.repeat = repeat
                    if repeat:
                        runs.append(run)
                    print(f"{run.front_end} {variant} #{repeat}: {run.tokens} tokens, "
                          f"{run.tokens_per_second:.1f} tok/s", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        chat.close()
        server.close()
    header = (f"`python -m localspec.bench frontends {' '.join(argv if argv is not None else sys.argv[1:])}`: "
              f"prompt {args.prompt}, up to {args.max_tokens} tokens, {args.repeats} repeats; "
              "engine tok/s, medians")  # fmt: skip
    print(render(summary(runs), header))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0
