"""Configuration: config.yaml defaults, checked strictly, overridable from flags and the UI.

Each section is a dataclass whose fields declare their range and a one-line
help (see :mod:`localspec.core.validation`). Loading rejects unknown keys and
out-of-range values with a message naming the key, so a typo in config.yaml
never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from localspec.core.errors import ConfigError
from localspec.core.modes import MODES
from localspec.core.options import MAX_DRAFT_TOKENS
from localspec.core.sampling import SamplingParams
from localspec.core.validation import allowed_text, coerce, setting, validate

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "config.yaml"


class _Section:
    """Validates its declared fields on construction (and so on every ``replace``)."""

    def __post_init__(self) -> None:
        validate(self, _SECTION_OF[type(self).__name__])


@dataclass(frozen=True)
class ModelConfig(_Section):
    pair: str = setting(
        "qwen2.5-coder-1.5b",
        "catalog pair to run (`localspec models list`); model.target/model.draft, when set, override its files",
    )
    target: str = setting("", "path of the target (large) GGUF model; empty = the pair's target")
    draft: str = setting(
        "", "path of the draft (small) GGUF model, 'ngram' for prompt lookup, 'none', or empty = the pair's draft"
    )
    n_ctx: int = setting(4096, "context window in tokens, for both models", 64, 1_048_576)
    n_batch: int = setting(512, "most tokens per llama_decode call (prompt evaluation)", 1, 65_536)
    threads: int = setting(0, "CPU threads per model; 0 = all physical cores", 0, 1024)
    n_gpu_layers: int = setting(-1, "layers offloaded to Metal/CUDA; -1 = all, 0 = none", -1, 100_000)
    flash_attention: bool = setting(False, "flash attention; off keeps CPU logits batch-invariant at every position")
    use_mmap: bool = setting(True, "memory-map the weights (false = read them into memory first)")
    rpc_servers: tuple[str, ...] = setting(
        (), "llama.cpp RPC servers (host:port) that hold the target's layers; the draft stays local"
    )
    rpc_output: str = setting(
        "remote",
        "where an RPC target's output layer runs without a local GPU: remote (llama.cpp's way) sends a row "
        "of logits back per row (600 KiB for a 152k vocabulary), local a hidden state but computes it here",
        choices=("local", "remote"),
    )


@dataclass(frozen=True)
class SamplingConfig(SamplingParams):
    """The sampling transform's fields plus the per-reply length and seed."""

    max_tokens: int = setting(512, "most tokens per reply", 1, 1_048_576)
    seed: int = setting(-1, "random seed; -1 = a fresh one per reply", -1, 2**63 - 1)

    def params(self) -> SamplingParams:
        names = {f.name for f in fields(SamplingParams)}
        return SamplingParams(**{k: v for k, v in asdict(self).items() if k in names})


@dataclass(frozen=True)
class SpeculativeConfig(_Section):
    mode: str = setting(
        "rejection",
        "how drafts are verified: rejection is exact at any temperature; "
        "invariant gives the same text for a seed with any draft",
        choices=MODES,
    )
    draft_tokens: int = setting(8, "draft tokens per step (K); the maximum when adaptive", 0, MAX_DRAFT_TOKENS)
    adaptive: bool = setting(True, "choose K each step from measured acceptance and costs")
    min_draft_tokens: int = setting(
        0,
        "smallest K adaptive drafting may choose; 0 lets it stop drafting where drafting does not pay",
        0,
        MAX_DRAFT_TOKENS,
    )
    lookup: bool = setting(
        True,
        "also copy drafts from the context (prompt lookup) where it predicts the reply; "
        "adaptive drafting picks lookup, the draft model or nothing each step",
    )
    remember: bool = setting(
        True,
        "keep what adaptive drafting learns (costs, acceptance) per pair, build and machine in the user's cache, "
        "so a new process starts where the last one ended",
    )


@dataclass(frozen=True)
class ChatConfig(_Section):
    system_prompt: str = setting("", "system message for chats; empty = the template's default")
    chat_template: bool = setting(True, "format prompts with the model's chat template (false = raw text)")


@dataclass(frozen=True)
class UIConfig(_Section):
    host: str = setting("127.0.0.1", "address the Gradio UI binds to (127.0.0.1 = this machine only)")
    port: int = setting(7860, "port of the Gradio UI", 1, 65535)


@dataclass(frozen=True)
class ServeConfig(_Section):
    host: str = setting("127.0.0.1", "address the API server binds to (127.0.0.1 = this machine only)")
    port: int = setting(8000, "port of the API server (0 = any free port)", 0, 65535)
    api_key: str = setting("", "require 'Authorization: Bearer <key>' on every API request; empty = no key")
    queue_limit: int = setting(8, "requests that may wait while one generates; more are answered 503", 0, 10_000)
    max_body_kb: int = setting(1024, "largest API request body in KiB; larger ones are answered 413", 1, 1_048_576)


@dataclass(frozen=True)
class TraceConfig(_Section):
    dir: str = setting("traces", "where traces (JSONL) are saved")
    top_n: int = setting(10, "top-N of p and q recorded per verified position in the UI and traces", 0, 100)


_SECTION_OF = {
    "ModelConfig": "model",
    "SamplingConfig": "sampling",
    "SpeculativeConfig": "speculative",
    "ChatConfig": "chat",
    "UIConfig": "ui",
    "ServeConfig": "serve",
    "TraceConfig": "trace",
}


@dataclass(frozen=True)
class Config:
    """All settings. Immutable: :meth:`with_overrides` returns a checked copy."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    ui: UIConfig = field(default_factory=UIConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    source: Path | None = None  # the file this came from; relative paths are relative to it

    def __post_init__(self) -> None:
        if self.speculative.min_draft_tokens > self.speculative.draft_tokens:
            raise ConfigError(
                f"speculative.min_draft_tokens = {self.speculative.min_draft_tokens} exceeds "
                f"speculative.draft_tokens = {self.speculative.draft_tokens}; lower it or raise draft_tokens"
            )

    def resolve_path(self, value: str) -> Path:
        """Where a model or trace path points. Paths written in a config file were made absolute
        against that file's folder when it was read, flags against the working directory; what
        is still relative (the built-in defaults) is relative to the project folder."""
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else PROJECT_ROOT / path

    def model_files(self) -> dict[str, Path]:
        """The model files the pair names, by role ("target", "draft"): not 'none', 'ngram' or empty."""
        specs = {"target": self.model.target, "draft": self.model.draft}
        return {role: self.resolve_path(spec) for role, spec in specs.items()
                if spec.strip() and spec.strip().lower() not in _NOT_PATHS}  # fmt: skip

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """A checked copy with dotted keys (``sampling.temperature``) replaced; ``None`` values are skipped."""
        by_section: dict[str, dict[str, Any]] = {}
        for key, value in overrides.items():
            if value is None:
                continue
            section, _, name = key.partition(".")
            if section not in _SECTIONS or name not in _field_names(getattr(self, section)):
                raise ConfigError(f"unknown setting {key!r}{_suggest(key, all_keys())}")
            by_section.setdefault(section, {})[name] = value
        spec = by_section.get("speculative", {})
        k = spec.get("draft_tokens")
        if isinstance(k, int) and "min_draft_tokens" not in spec and k < self.speculative.min_draft_tokens:
            # an explicit K (say -k 0) below the configured adaptive minimum lowers that minimum
            # rather than being refused: the minimum is a default, the K was asked for
            spec["min_draft_tokens"] = k
        return replace(self, **{s: replace(getattr(self, s), **v) for s, v in by_section.items()})

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: asdict(getattr(self, name)) for name in _SECTIONS}


_SECTIONS = tuple(_SECTION_OF.values())
PATH_KEYS = ("model.target", "model.draft", "trace.dir")
_NOT_PATHS = ("none", "ngram")


def absolute_path(value: str, base: Path) -> str:
    """``value`` made absolute against ``base`` (keeps '', 'none', 'ngram' and absolute paths)."""
    if value.strip().lower() in _NOT_PATHS or not value.strip():
        return value
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else (base / path))


def _field_names(section: Any) -> set[str]:
    return {f.name for f in fields(section)}


def all_keys() -> list[str]:
    cfg = Config()
    return [f"{s}.{f.name}" for s in _SECTIONS for f in fields(getattr(cfg, s))]


@dataclass(frozen=True)
class SettingInfo:
    """One declared setting (see :func:`localspec.core.validation.setting`), for the front ends.

    The CLI's flags, the terminal's slash commands and the UI's controls are
    generated from these: their type, help text and allowed values are the
    declaration's, never a copy of it.
    """

    key: str
    kind: str  # "int", "float", "bool" or "str"
    default: Any
    help: str
    lo: float | None
    hi: float | None
    choices: tuple[Any, ...] | None
    allowed: str
    declaration: Any = field(repr=False, compare=False)  # the dataclass field itself

    @property
    def name(self) -> str:
        return self.key.partition(".")[2]

    @property
    def expects(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        return {"int": "a whole number", "float": "a number", "bool": "on or off"}.get(self.kind, "some text")

    def parse(self, value: Any, name: str) -> Any:
        """A value a person entered (text, a widget's number, or nothing) as this setting's type;
        ``name`` is how they know the setting (``/temp``, ``temperature``). The range is checked
        by :meth:`Config.with_overrides`, with the same message as everywhere else."""
        if value is None or (isinstance(value, str) and not value.strip() and self.kind != "str"):
            raise ConfigError(f"{name} is empty; enter {self.expects}")
        try:
            return coerce(value, self.kind, name, self.declaration)
        except ConfigError:
            raise ConfigError(f"{name} needs {self.expects}, not {value!r}") from None


def describe(key: str) -> SettingInfo:
    """The declaration of one setting, by dotted key; an unknown key names the closest known one."""
    section, _, name = key.partition(".")
    if section not in _SECTIONS or name not in _field_names(getattr(Config(), section)):
        raise ConfigError(f"unknown setting {key!r}{_suggest(key, all_keys())}")
    f = next(f for f in fields(getattr(Config(), section)) if f.name == name)
    meta = f.metadata
    kind = (f.type if isinstance(f.type, str) else f.type.__name__).replace(" ", "")
    choices = tuple(meta["choices"]) if meta.get("choices") is not None else None
    return SettingInfo(key, kind, f.default, meta["help"], meta.get("lo"), meta.get("hi"), choices, allowed_text(f), f)


# settings that existed once: a config file written for an older version names them
RETIRED = {"speculative.ngram_max": "prompt lookup finds the longest agreeing text by itself; delete the line"}


def _suggest(key: str, candidates: list[str]) -> str:
    if key in RETIRED:
        return f" (retired: {RETIRED[key]})"
    close = difflib.get_close_matches(key, candidates, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known settings: {', '.join(candidates)}"


def load_config(path: str | Path | None = None) -> Config:
    """Read and check a config file (default: ``$LOCALSPEC_CONFIG`` or the project's config.yaml)."""
    path = Path(path) if path is not None else Path(os.environ.get("LOCALSPEC_CONFIG") or DEFAULT_CONFIG)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; pass --config PATH or restore config.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path} is not valid YAML{where}; fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping of sections ({', '.join(_SECTIONS)})")
    overrides: dict[str, Any] = {}
    for section, values in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown section {section!r}{_suggest(str(section), list(_SECTIONS))}")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping of keys")
        for key, value in values.items():
            if value is None:
                raise ConfigError(f"{path}: {section}.{key} has no value; give one or delete the line")
            overrides[f"{section}.{key}"] = value
    base = path.resolve().parent
    for key in PATH_KEYS:
        if key in overrides:
            overrides[key] = absolute_path(str(overrides[key]), base)
    try:
        return Config(source=path.resolve()).with_overrides(overrides)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
