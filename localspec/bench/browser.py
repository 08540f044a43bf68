"""``python -m localspec.bench ui``: the chat UI in a real Chromium against the API, on one loaded pair.

Starts ``localspec ui --api`` (the chat and the OpenAI-compatible API share the
process and the loaded models), opens the chat in Chromium through Playwright,
and for each repeat and variant sends the same prompt, seed and settings once
through the page and once through the API, in turn (interleaved, so a
background process or a warm cache favours neither). Each reply gives two
rates: the engine's own (tokens over decode seconds: what llama.cpp achieved
while the front end ran beside it) and the one a reader sees (tokens after the
first update over the seconds until the last). The report is the medians and
the UI's share of the API's.

``--first-reply`` times what a user sees first instead: per repeat and
variant, a fresh ``localspec ui`` process and page and one reply through it
(it resumes what earlier processes learnt), reported against the target
alone's first reply.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from localspec.bench.markdown import table

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
# name -> (mode, temperature). The default's page and API replies are different texts (adaptive K follows timings
# and changes the sample), so their rates compare replies of different acceptance; invariant mode's are one text.
VARIANTS = {"target-only": ("target-only", 0.0), "default": ("rejection", 0.7), "invariant": ("invariant", 0.7)}
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

# Installed before each send: times the first token on screen and the moment the reply is whole (its
# streaming cursor gone), and counts the tokens the first update brought. The bench then awaits its
# promise: polling the page every frame (Playwright's wait_for_function) would make the browser draw
# every frame, and that cost would be charged to the UI.
WATCH_JS = """() => {
  let finish;
  window.lsBench = { first: null, firstTokens: 0, done: null, finished: new Promise(r => { finish = r; }) };
  const seen = new MutationObserver(() => {  // as little work as a mutation allows: the page pays for it
    if (window.lsBench.first === null) {
      const bubble = document.querySelector('#ls-chat-log .ls-assistant:last-of-type .ls-bubble');
      if (!bubble || !bubble.querySelector('.ls-tok')) return;
      window.lsBench.first = performance.now();
      window.lsBench.firstTokens = bubble.querySelectorAll('.ls-tok').length;
    } else if (!document.querySelector('#ls-chat-log .ls-cursor')) {
      window.lsBench.done = performance.now();
      seen.disconnect();
      finish();
    }
  });
  seen.observe(document.getElementById('ls-chat'), { childList: true, subtree: true });
}"""
COUNT_JS = """() => new Set([...document.querySelectorAll('#ls-chat-log .ls-assistant:last-of-type .ls-tok[data-i]')]
  .map(e => e.dataset.i)).size"""


@dataclass
class Reply:
    """One timed reply."""

    front_end: str  # ui / api
    variant: str
    repeat: int
    tokens: int
    engine_tps: float  # tokens over the engine's decode seconds
    seen_tps: float  # tokens after the first update over the seconds to the last, as the reader sees them
    verdict: str = ""  # what the UI's stats panel said about the reply's speed


def ui_reply(page, prompt: str, variant: str, seed: int, max_tokens: int, repeat: int) -> Reply:
    """One reply through the page: a cleared chat, the panel set, the message sent, the reply watched to its end."""
    page.locator("#ls-clear").click()
    page.wait_for_selector("#ls-chat-log .ls-empty")
    mode, temperature = VARIANTS[variant]
    if page.locator("#ls-mode input").input_value() != mode:
        page.locator("#ls-mode input").click()
        page.get_by_role("option", name=mode, exact=True).click()
    for box, value in (("#ls-temperature input[type=number]", temperature), ("#ls-seed input", seed),
                       ("#ls-max-tokens input", max_tokens)):  # fmt: skip
        page.locator(box).fill(str(value))
        page.locator(box).press("Tab")
    page.evaluate(WATCH_JS)
    page.locator("#ls-message textarea").fill(prompt)
    page.locator("#ls-send").click()
    page.evaluate("window.lsBench.finished")
    timing = page.evaluate(
        "({ first: window.lsBench.first, firstTokens: window.lsBench.firstTokens, done: window.lsBench.done })"
    )
    tokens = page.evaluate(COUNT_JS)
    engine = float(page.locator("#ls-stats [data-stat=tps] .ls-card-v").inner_text())
    seen = (tokens - timing["firstTokens"]) / max((timing["done"] - timing["first"]) / 1000, 1e-9)
    verdict = page.locator("#ls-stats .ls-verdict")
    return Reply("ui", variant, repeat, tokens, engine, seen, verdict.inner_text() if verdict.count() else "")


def api_reply(base: str, prompt: str, variant: str, seed: int, max_tokens: int, repeat: int) -> Reply:
    """The same reply through the API, streamed: the first and last content chunks timed, tokens counted."""
    mode, temperature = VARIANTS[variant]
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "mode": mode, "stream": True}  # fmt: skip
    first = last = None
    tokens = first_tokens = 0
    engine = 0.0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            extra = chunk.get("localspec", {})
            if "tokens_per_second" in extra:
                engine = extra["tokens_per_second"]
            if extra.get("tokens"):
                last = time.perf_counter()
                tokens += len(extra["tokens"])
                if first is None:
                    first, first_tokens = last, tokens
    seen = (tokens - first_tokens) / max(last - first, 1e-9) if first is not None else 0.0
    return Reply("api", variant, repeat, tokens, engine, seen)


def summary(replies: list[Reply]) -> list[dict[str, Any]]:
    """Per variant: medians of both rates for each front end, and the UI's share of the API's."""
    rows = []
    for variant in VARIANTS:
        mine = {end: [r for r in replies if r.variant == variant and r.front_end == end] for end in ("ui", "api")}
        if not mine["ui"] or not mine["api"]:
            continue
        row: dict[str, Any] = {"variant": variant}
        for end, found in mine.items():
            row[f"{end}_engine"] = statistics.median(r.engine_tps for r in found)
            row[f"{end}_seen"] = statistics.median(r.seen_tps for r in found)
            row[f"{end}_tokens"] = statistics.median(r.tokens for r in found)
        row["engine_ratio"] = row["ui_engine"] / row["api_engine"] if row["api_engine"] else None
        row["seen_ratio"] = row["ui_seen"] / row["api_seen"] if row["api_seen"] else None
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["variant", "tokens", "UI engine tok/s", "API engine tok/s", "UI / API", "UI seen tok/s",
               "API seen tok/s", "UI / API"]  # fmt: skip
    cells = [[r["variant"], f"{r['ui_tokens']:.0f}", f"{r['ui_engine']:.1f}", f"{r['api_engine']:.1f}",
              f"{r['engine_ratio']:.2f}", f"{r['ui_seen']:.1f}", f"{r['api_seen']:.1f}", f"{r['seen_ratio']:.2f}"]
             for r in rows]  # fmt: skip
    return header + "\n\n" + table(columns, cells)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(pair_args: list[str], port: int) -> subprocess.Popen:
    """``localspec ui --api`` on ``port``, returned once it printed its ready line."""
    command = [sys.executable, "-m", "localspec", "ui", "--api", "--port", str(port), *pair_args]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    for line in server.stdout:
        if line.startswith("localspec UI: "):
            return server
    raise SystemExit(f"`localspec ui --api` exited with {server.wait()} before it was ready")


def _report(reply: Reply) -> None:
    print(f"{reply.front_end} {reply.variant} #{reply.repeat}: {reply.tokens} tokens, engine {reply.engine_tps:.1f} "
          f"tok/s, seen {reply.seen_tps:.1f} tok/s" + (f"; verdict: {reply.verdict}" if reply.verdict else ""),
          file=sys.stderr, flush=True)  # fmt: skip


def _open(browser, base: str, tabs: int) -> list:
    pages = [browser.new_page(viewport={"width": 1440, "height": 1000}) for _ in range(max(1, tabs))]
    for page in pages:
        page.goto(base, wait_until="load")
        page.wait_for_selector("#ls-message textarea", timeout=120_000)
    return pages


def interleaved(browser, pair_args: list[str], text: str, max_tokens: int, repeats: int, tabs: int,
                variants: list[str]) -> list[Reply]:  # fmt: skip
    """One UI process; per repeat and variant one reply through the page, then the same through the API."""
    port = _free_port()
    server = _start(pair_args, port)
    base = f"http://127.0.0.1:{port}"
    replies: list[Reply] = []
    try:
        page = _open(browser, base, tabs)[0]
        for repeat in range(repeats + 1):  # round 0 warms up (caches, the controller) and is not kept
            for variant in variants:
                seed = 1000 + repeat
                for reply in (ui_reply(page, text, variant, seed, max_tokens, repeat),
                              api_reply(base, text, variant, seed, max_tokens, repeat)):  # fmt: skip
                    if repeat:
                        replies.append(reply)
                    _report(reply)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return replies


def first_replies(browser, pair_args: list[str], text: str, max_tokens: int, repeats: int,
                  variants: list[str]) -> list[Reply]:  # fmt: skip
    """Per repeat and variant, in turn: a fresh UI process, a fresh page, one reply through it."""
    replies: list[Reply] = []
    for repeat in range(1, repeats + 1):
        for variant in variants:
            port = _free_port()
            server = _start(pair_args, port)
            try:
                page = _open(browser, f"http://127.0.0.1:{port}", 1)[0]
                reply = ui_reply(page, text, variant, 1000 + repeat, max_tokens, repeat)
                page.close()
            finally:
                server.terminate()
                server.wait(timeout=60)
            replies.append(reply)
            _report(reply)
    return replies


def first_summary(replies: list[Reply]) -> list[dict[str, Any]]:
    rows = [{"variant": variant, "engine": statistics.median(r.engine_tps for r in mine),
             "seen": statistics.median(r.seen_tps for r in mine), "tokens": statistics.median(r.tokens for r in mine)}
            for variant in VARIANTS if (mine := [r for r in replies if r.variant == variant])]  # fmt: skip
    alone = rows[0]["engine"] if rows and rows[0]["variant"] == "target-only" else None
    for row in rows:
        row["ratio"] = row["engine"] / alone if alone else None
    return rows


def render_first(rows: list[dict[str, Any]], header: str) -> str:
    cells = [[r["variant"], f"{r['tokens']:.0f}", f"{r['engine']:.1f}", f"{r['ratio']:.2f}", f"{r['seen']:.1f}"]
             for r in rows]  # fmt: skip
    return header + "\n\n" + table(["variant", "tokens", "engine tok/s", "/ target-only", "seen tok/s"], cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.bench ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="essay", help="a bench prompt's name (localspec/bench/prompts.yaml)")
    parser.add_argument(
        "--text", default=None, help="a prompt of your own instead (say, one that asks for a long reply)"
    )
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default="target-only,default",
                        help=f"comma-separated, from {', '.join(VARIANTS)}")  # fmt: skip
    parser.add_argument("--tabs", type=int, default=1, help="chat tabs open in the browser (the others stay idle)")
    parser.add_argument(
        "--first-reply",
        action="store_true",
        help="time only the first reply of a fresh UI process per variant (no API)",
    )
    parser.add_argument("--chromium", default=CHROMIUM, help="the Chromium to drive (Debian's package by default)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write every reply as JSON here")
    args, pair_args = parser.parse_known_args(argv)  # the rest (--pair, --target, --draft, --threads ...) go to the UI
    from playwright.sync_api import sync_playwright

    if not Path(args.chromium).exists() and not shutil.which(args.chromium):
        raise SystemExit(f"no Chromium at {args.chromium}; install Debian's chromium package or pass --chromium PATH")
    prompts = {p["name"]: p["prompt"] for p in yaml.safe_load(PROMPTS_FILE.read_text())}
    if args.text:
        args.prompt, prompts = "own", {"own": args.text}
    if args.prompt not in prompts:
        raise SystemExit(f"no bench prompt {args.prompt!r}; choose from {', '.join(prompts)}")
    text = prompts[args.prompt]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants {args.variants!r}: choose from {', '.join(VARIANTS)}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=ARGS, headless=True)
        try:
            if args.first_reply:
                replies = first_replies(browser, pair_args, text, args.max_tokens, args.repeats, variants)
            else:
                replies = interleaved(browser, pair_args, text, args.max_tokens, args.repeats, args.tabs, variants)
        finally:
            browser.close()
    what = "the first reply of a fresh `localspec ui`" if args.first_reply else f"{max(1, args.tabs)} tab(s)"
    header = (f"`python -m localspec.bench ui {' '.join(argv or sys.argv[1:])}`: prompt {args.prompt}, up to "
              f"{args.max_tokens} tokens, {args.repeats} repeats, {what}; medians")  # fmt: skip
    print(render_first(first_summary(replies), header) if args.first_reply else render(summary(replies), header))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps([r.__dict__ for r in replies], indent=1))
    return 0
