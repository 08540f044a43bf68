"""``python -m localspec.bench rpc``: the target across llama.cpp RPC servers, behind added round-trip delay.

Starts ``--servers`` ``localspec rpc-server`` processes on loopback (or takes ``--rpc`` endpoints), and
for each added delay (``--delays``, ms per round trip) puts a delaying proxy (:mod:`localspec.bench.delay`)
in front of each server, loads the pair with the target's layers on the servers through the proxies (the
draft local) and times the target alone and the default (adaptive model + lookup) on every prompt,
interleaved as ``localspec bench`` does. Per delay and variant: tokens/s, the speedup, the round trips per
target decode the proxies counted, and the cost model's network term: predicted seconds = the variant's
seconds at the first delay + its target decodes x round trips per decode x the added delay. On one
machine the servers and the local draft share the cores, which a real second machine would not.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from localspec.app.config import load_config
from localspec.app.engine import Engine
from localspec.bench.delay import DelayProxy
from localspec.bench.e2e import VARIANTS, Bench, BenchSettings, load_prompts
from localspec.bench.markdown import table

BENCH_VARIANTS = ("target-only", "hybrid")


@contextmanager
def local_servers(count: int, threads: int):
    """``count`` ``localspec rpc-server`` processes on free loopback ports; yields their endpoints."""
    with ExitStack() as stack:
        endpoints = []
        for _ in range(count):
            command = [
                sys.executable,
                "-m",
                "localspec",
                "rpc-server",
                "--port",
                str(_free_port()),
                "--threads",
                str(threads),
            ]
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            stack.callback(proc.wait)
            stack.callback(proc.terminate)
            for line in proc.stdout:
                if line.startswith("localspec rpc-server: listening on "):
                    endpoints.append(line.rsplit(" ", 1)[1].strip())
                    break
            else:
                raise SystemExit(f"`localspec rpc-server` exited with {proc.wait()} before it listened")
        yield endpoints


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(config, endpoints: list[str], delay_ms: float, prompts, repeats: int, max_tokens: int) -> list[dict]:
    """One delay: the pair loaded through a delaying proxy per server, every (repeat, prompt, variant) in turn."""
    with ExitStack() as stack:
        proxies = [DelayProxy(endpoint, delay_ms / 1000).start() for endpoint in endpoints]
        for proxy in proxies:
            stack.callback(proxy.stop)
        engine = Engine(config.with_overrides({"model.rpc_servers": [p.endpoint for p in proxies],
                                               "speculative.remember": False}))  # fmt: skip
        stack.callback(engine.close)
        bench = Bench(engine, BenchSettings(variants=BENCH_VARIANTS, max_tokens=max_tokens))
        tokens = {p["name"]: bench.prompt_tokens(p["prompt"]) for p in prompts}
        for name in BENCH_VARIANTS:  # warm-up
            bench.run_one(VARIANTS[name], prompts[0]["name"], tokens[prompts[0]["name"]], -1, 16)
        rows = []
        for repeat in range(repeats):
            for prompt in prompts:
                for name in BENCH_VARIANTS:
                    trips, decodes = sum(p.round_trips for p in proxies), engine.target.n_decodes
                    run = bench.run_one(VARIANTS[name], prompt["name"], tokens[prompt["name"]], repeat, max_tokens)
                    rows.append({"delay_ms": delay_ms, "variant": name, "prompt": prompt["name"], "repeat": repeat,
                                 "tokens": run.stats.n_tokens, "seconds": run.stats.decode_s,
                                 "decodes": engine.target.n_decodes - decodes,
                                 "round_trips": sum(p.round_trips for p in proxies) - trips})  # fmt: skip
                    print(
                        f"{delay_ms:g} ms {name} {prompt['name']} #{repeat}: {rows[-1]['tokens']} tokens, "
                        f"{rows[-1]['tokens'] / rows[-1]['seconds']:.1f} tok/s",
                        file=sys.stderr,
                        flush=True,
                    )
        return rows


def summary(rows: list[dict]) -> list[dict[str, Any]]:
    """Medians per (delay, variant, prompt), the speedup over the target alone, and the network term's prediction."""
    out = []
    keys = sorted({(r["delay_ms"], r["prompt"], r["variant"]) for r in rows})
    first_delay = min(r["delay_ms"] for r in rows)
    for delay, prompt, variant in keys:
        mine = [r for r in rows if (r["delay_ms"], r["prompt"], r["variant"]) == (delay, prompt, variant)]
        base = [r for r in rows if (r["delay_ms"], r["prompt"], r["variant"]) == (first_delay, prompt, variant)]
        seconds_per_token = statistics.median(r["seconds"] / r["tokens"] for r in mine)
        trips_per_decode = sum(r["round_trips"] for r in mine) / max(1, sum(r["decodes"] for r in mine))
        decodes_per_token = sum(r["decodes"] for r in mine) / sum(r["tokens"] for r in mine)
        predicted = statistics.median(r["seconds"] / r["tokens"] for r in base) + decodes_per_token * (
            trips_per_decode * (delay - first_delay) / 1000
        )
        out.append({"delay_ms": delay, "prompt": prompt, "variant": variant, "tok_s": 1 / seconds_per_token,
                    "trips_per_decode": trips_per_decode, "decodes_per_token": decodes_per_token,
                    "predicted_tok_s": 1 / predicted,
                    "measured_over_predicted": predicted / seconds_per_token})  # fmt: skip
    for row in out:
        alone = next(r for r in out if (r["delay_ms"], r["prompt"], r["variant"]) ==
                     (row["delay_ms"], row["prompt"], "target-only"))  # fmt: skip
        row["speedup"] = row["tok_s"] / alone["tok_s"]
    return out


def render(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["added delay", "prompt", "variant", "tok/s", "× target alone", "round trips / decode",
               "decodes / token", "predicted tok/s", "measured / predicted"]  # fmt: skip
    cells = [[f"{r['delay_ms']:g} ms", r["prompt"], r["variant"], f"{r['tok_s']:.1f}", f"{r['speedup']:.2f}",
              f"{r['trips_per_decode']:.2f}", f"{r['decodes_per_token']:.2f}", f"{r['predicted_tok_s']:.1f}",
              f"{r['measured_over_predicted']:.2f}"] for r in rows]  # fmt: skip
    return header + "\n\n" + table(columns, cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.bench rpc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rpc", action="append", default=[], help="an RPC server's host:port (repeatable)")
    parser.add_argument("--servers", type=int, default=2, help="local servers to start when no --rpc is given")
    parser.add_argument("--server-threads", type=int, default=1, help="CPU threads of each local server")
    parser.add_argument("--delays", default="0,1,5", help="added round-trip delays in ms, comma-separated")
    parser.add_argument("--prompts", default=None, help="prompt names (default: all)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--pair", default=None, help="a catalog pair (default: config.yaml's)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of the local models (0 = all cores)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write every run here")
    args = parser.parse_args(argv)
    config = load_config()
    if args.pair:
        from localspec.app.catalog import select_pair

        config = select_pair(config, args.pair)
    from localspec.app.catalog import resolve_pair

    config = resolve_pair(config).with_overrides({"model.threads": args.threads})
    prompts = load_prompts([p for p in (args.prompts or "").split(",") if p] or None)
    delays = [float(d) for d in args.delays.split(",")]
    with ExitStack() as stack:
        endpoints = args.rpc or stack.enter_context(local_servers(args.servers, args.server_threads))
        rows = []
        for delay in delays:
            rows += measure(config, endpoints, delay, prompts, args.repeats, args.max_tokens)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))
    where = ", ".join(args.rpc) if args.rpc else f"{args.servers} local servers ({args.server_threads} thread each)"
    header = (f"target {Path(config.model.target).name} across {where}, draft {Path(config.model.draft).name} local; "
              f"{args.repeats} repeats x {len(prompts)} prompts, {args.max_tokens} tokens; medians. On one machine "
              "the servers and the local draft share the cores, which a second machine would not.")  # fmt: skip
    print(render(summary(rows), header))
    return 0
