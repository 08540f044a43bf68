"""``python -m localspec.bench rpc``: the target across llama.cpp RPC servers, behind added round-trip delay.

Starts ``--servers`` ``localspec rpc-server`` processes on loopback (or takes ``--rpc`` endpoints), and
for each link (``--delays`` in ms per round trip, ``--mbit`` each way, ``--outputs``: whether the target's
output layer runs on the last server or here) puts a delaying proxy (:mod:`localspec.bench.delay`) in front
of each server, loads the pair with the target's layers on the servers through the proxies (the
draft local) and times the target alone and the default (adaptive model + lookup) on every prompt,
interleaved as ``localspec bench`` does, both at the default's temperature. Per link and variant:
tokens/s, the speedup, the round trips per target decode and the KiB per token the proxies counted,
and the cost model's network term: predicted seconds = the variant's seconds on the placement's first
link + its target decodes x (round trips per decode x the added delay + bytes per decode / the
bandwidth). On one machine the servers and the local draft share the cores, which a real second
machine would not.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.app.config import load_config
from localspec.app.engine import Engine
from localspec.bench.delay import DelayProxy
from localspec.bench.e2e import SAMPLED_BASELINE, VARIANTS, Bench, BenchSettings, load_prompts
from localspec.bench.markdown import table

BASELINE = SAMPLED_BASELINE  # the target alone at the default's temperature: the same sampling work a token
BENCH_VARIANTS = (BASELINE, "hybrid")


@dataclass(frozen=True)
class Link:
    """What the proxies add between here and the servers, and where the target's output layer runs."""

    delay_ms: float
    mbit_s: float  # 0: loopback's own rate
    output: str  # model.rpc_output: "local" (the output layer here) or "remote" (on the last server)

    @property
    def name(self) -> str:
        rate = f", {self.mbit_s:g} Mbit/s" if self.mbit_s else ""
        return f"{self.delay_ms:g} ms{rate}, output {self.output}"


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
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    preexec_fn=_dies_with_parent if sys.platform == "linux" else None)  # fmt: skip
            stack.callback(proc.wait)
            stack.callback(proc.terminate)
            for line in proc.stdout:
                if line.startswith("localspec rpc-server: listening on "):
                    endpoints.append(line.rsplit(" ", 1)[1].strip())
                    break
            else:
                raise SystemExit(f"`localspec rpc-server` exited with {proc.wait()} before it listened")
        yield endpoints


def _dies_with_parent() -> None:
    """In a server's process before it starts (Linux): SIGTERM when the bench dies, also by a signal that
    skips the bench's own clean-up (an interrupted bench used to leave its servers running)."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(config, endpoints: list[str], link: Link, prompts, repeats: int, max_tokens: int) -> list[dict]:
    """One link: the pair loaded through a delaying proxy per server, every (repeat, prompt, variant) in turn."""
    with ExitStack() as stack:
        rate = link.mbit_s * 1e6 or None
        proxies = [DelayProxy(endpoint, link.delay_ms / 1000, rate).start() for endpoint in endpoints]
        for proxy in proxies:
            stack.callback(proxy.stop)
        engine = Engine(
            config.with_overrides(
                {
                    "model.rpc_servers": [p.endpoint for p in proxies],
                    "model.rpc_output": link.output,
                    "speculative.remember": False,
                }
            )
        )
        stack.callback(engine.close)
        bench = Bench(engine, BenchSettings(variants=BENCH_VARIANTS, max_tokens=max_tokens))
        tokens = {p["name"]: bench.prompt_tokens(p["prompt"]) for p in prompts}
        for name in BENCH_VARIANTS:  # warm-up
            bench.run_one(VARIANTS[name], prompts[0]["name"], tokens[prompts[0]["name"]], -1, 16)
        rows = []
        for repeat in range(repeats):
            for prompt in prompts:
                for name in BENCH_VARIANTS:
                    before = _counters(proxies, engine)
                    run = bench.run_one(VARIANTS[name], prompt["name"], tokens[prompt["name"]], repeat, max_tokens)
                    after = _counters(proxies, engine)
                    rows.append({"link": link.name, "delay_ms": link.delay_ms, "mbit_s": link.mbit_s,
                                 "output": link.output, "variant": name, "prompt": prompt["name"], "repeat": repeat,
                                 "tokens": run.stats.n_tokens, "seconds": run.stats.decode_s,
                                 **{key: after[key] - before[key] for key in after}})  # fmt: skip
                    print(
                        f"{link.name} {name} {prompt['name']} #{repeat}: {rows[-1]['tokens']} tokens, "
                        f"{rows[-1]['tokens'] / rows[-1]['seconds']:.1f} tok/s",
                        file=sys.stderr,
                        flush=True,
                    )
        return rows


def _counters(proxies: list[DelayProxy], engine: Engine) -> dict[str, int]:
    """The running totals a run's row takes the difference of."""
    return {"decodes": engine.target.n_decodes, "round_trips": sum(p.round_trips for p in proxies),
            "received": sum(p.bytes_sent["server"] for p in proxies),
            "sent": sum(p.bytes_sent["client"] for p in proxies)}  # fmt: skip


def summary(rows: list[dict]) -> list[dict[str, Any]]:
    """Medians per (link, prompt, variant), the speedup over the target alone on that link, and the network
    term's prediction: the same output placement's seconds on the first (fastest) link, plus per target
    decode the round trips times the added delay and the bytes over the bandwidth."""
    out = []
    for key in dict.fromkeys((r["link"], r["prompt"], r["variant"]) for r in rows):
        mine = [r for r in rows if (r["link"], r["prompt"], r["variant"]) == key]
        first = next(r for r in rows if r["output"] == mine[0]["output"])  # that placement's fastest link
        base = [r for r in rows if (r["link"], r["prompt"], r["variant"]) == (first["link"], *key[1:])]
        seconds_per_token = statistics.median(r["seconds"] / r["tokens"] for r in mine)
        tokens, decodes = sum(r["tokens"] for r in mine), max(1, sum(r["decodes"] for r in mine))
        moved = sum(r["received"] + r["sent"] for r in mine)  # bytes, both ways
        trips_per_decode = sum(r["round_trips"] for r in mine) / decodes
        bytes_per_decode = moved / decodes
        network = network_seconds(mine[0], trips_per_decode, bytes_per_decode) - network_seconds(
            first, trips_per_decode, bytes_per_decode
        )
        predicted = statistics.median(r["seconds"] / r["tokens"] for r in base) + decodes / tokens * network
        out.append({"link": key[0], "prompt": key[1], "variant": key[2], "tok_s": 1 / seconds_per_token,
                    "delay_ms": mine[0]["delay_ms"], "output": mine[0]["output"],
                    "trips_per_decode": trips_per_decode, "decodes_per_token": decodes / tokens,
                    "kib_per_token": moved / tokens / 1024,
                    "predicted_tok_s": 1 / predicted,
                    "measured_over_predicted": predicted / seconds_per_token})  # fmt: skip
    for row in out:
        alone = next(r for r in out if (r["link"], r["prompt"], r["variant"]) ==
                     (row["link"], row["prompt"], BASELINE))  # fmt: skip
        row["speedup"] = row["tok_s"] / alone["tok_s"]
    return out


def network_seconds(run: dict, trips_per_decode: float, bytes_per_decode: float) -> float:
    """What the link adds to one target decode: its round trips' delay, and its bytes at its bandwidth."""
    wire = bytes_per_decode * 8 / (run["mbit_s"] * 1e6) if run["mbit_s"] else 0.0
    return trips_per_decode * run["delay_ms"] / 1000 + wire


def render(rows: list[dict[str, Any]], header: str) -> str:
    columns = ["link", "prompt", "variant", "tok/s", "× target alone", "round trips / decode", "decodes / token",
               "KiB / token", "predicted tok/s", "measured / predicted"]  # fmt: skip
    cells = [[r["link"], r["prompt"], r["variant"], f"{r['tok_s']:.1f}", f"{r['speedup']:.2f}",
              f"{r['trips_per_decode']:.2f}", f"{r['decodes_per_token']:.2f}", f"{r['kib_per_token']:.0f}",
              f"{r['predicted_tok_s']:.1f}", f"{r['measured_over_predicted']:.2f}"] for r in rows]  # fmt: skip
    return header + "\n\n" + table(columns, cells)


def write_plot(rows: list[dict[str, Any]], path: str | Path, title: str) -> Path:
    """The default's speedup over the target alone against the added delay: a line per prompt, solid with
    the output layer on the server, dashed with it here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drafted = [r for r in rows if r["variant"] != BASELINE]
    for index, prompt in enumerate(dict.fromkeys(r["prompt"] for r in drafted)):
        for output, style in (("remote", "-"), ("local", "--")):
            mine = sorted((r for r in drafted if r["prompt"] == prompt and r["output"] == output),
                          key=lambda r: r["delay_ms"])  # fmt: skip
            where = "on the server" if output == "remote" else "here"
            if mine:
                ax.plot([r["delay_ms"] for r in mine], [r["speedup"] for r in mine], style, marker="o",
                        color=f"C{index}", label=f"{prompt}, output {where}")  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("added round trip (ms)")
    ax.set_ylabel("x the target alone over the same link")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.bench rpc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rpc", action="append", default=[], help="an RPC server's host:port (repeatable)")
    parser.add_argument("--servers", type=int, default=2, help="local servers to start when no --rpc is given")
    parser.add_argument("--server-threads", type=int, default=1, help="CPU threads of each local server")
    parser.add_argument("--delays", default="0,1,5", help="added round-trip delays in ms, comma-separated")
    parser.add_argument("--mbit", type=float, default=0, help="the link's rate each way in Mbit/s (0: loopback's)")
    parser.add_argument(
        "--outputs", default="remote", help="where the target's output layer runs: remote, local or both (comma)"
    )
    parser.add_argument("--prompts", default=None, help="prompt names (default: all)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--pair", default=None, help="a catalog pair (default: config.yaml's)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of the local models (0 = all cores)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write every run here")
    parser.add_argument("--plot", dest="plot_path", default=None, help="also draw the speedup over the delay (PNG)")
    args = parser.parse_args(argv)
    config = load_config()
    if args.pair:
        from localspec.app.catalog import select_pair

        config = select_pair(config, args.pair)
    from localspec.app.catalog import resolve_pair

    config = resolve_pair(config).with_overrides({"model.threads": args.threads})
    prompts = load_prompts([p for p in (args.prompts or "").split(",") if p] or None)
    delays = [float(delay) for delay in args.delays.split(",")]
    links = [Link(delay, args.mbit, output) for output in args.outputs.split(",") for delay in delays]
    with ExitStack() as stack:
        endpoints = args.rpc or stack.enter_context(local_servers(args.servers, args.server_threads))
        rows = []
        for link in links:
            rows += measure(config, endpoints, link, prompts, args.repeats, args.max_tokens)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))
    where = ", ".join(args.rpc) if args.rpc else f"{args.servers} local servers ({args.server_threads} thread(s) each)"
    header = (f"target {Path(config.model.target).name} across {where}, draft {Path(config.model.draft).name} local; "
              f"{args.repeats} repeats x {len(prompts)} prompts, {args.max_tokens} tokens; medians. On one machine "
              "the servers and the local draft share the cores, which a second machine would not.")  # fmt: skip
    summarised = summary(rows)
    print(render(summarised, header))
    if args.plot_path:
        link = f", {args.mbit:g} Mbit/s" if args.mbit else ""
        title = f"{Path(config.model.target).name} across {where}{link}; draft local"
        print(f"plot: {write_plot(summarised, args.plot_path, title)}")
    return 0
