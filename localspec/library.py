"""The Python API: load a pair once, ask it for replies or stream their events (see :mod:`localspec`).

A front end like the others: it builds a :class:`localspec.app.config.Config`
from the project's config file and keyword settings, loads an
:class:`localspec.app.engine.Engine`, and turns each request into the same
prompt, options and sampling parameters the CLI uses.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localspec.app.config import Config, all_keys, load_config
from localspec.app.engine import Engine
from localspec.core.errors import ConfigError
from localspec.core.events import GenerationResult, StepEvent, TokenEvent


def settings_by_name(settings: dict[str, Any]) -> dict[str, Any]:
    """Keyword settings as config keys: a dotted key as it is, a short name (``temperature``,
    ``n_ctx``, ``pair``) for the one setting of that name; an unknown or ambiguous name says so."""
    keys: dict[str, list[str]] = {}
    for key in all_keys():
        keys.setdefault(key.partition(".")[2], []).append(key)
    out = {}
    for name, value in settings.items():
        if "." in name:
            out[name] = value
            continue
        found = keys.get(name, [])
        if len(found) > 1:
            raise ConfigError(f"setting {name!r} is ambiguous; name one of {', '.join(found)}")
        if not found:
            close = difflib.get_close_matches(name, list(keys), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "config.yaml lists every setting"
            raise ConfigError(f"setting {name!r} is unknown; {hint}")
        out[found[0]] = value
    return out


class Pair:
    """A loaded target and draft. Close it (or use ``with``) to free the models."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def name(self) -> str:
        return self.engine.pair_name

    def stream(self, prompt: str, **settings: Any) -> Iterator[TokenEvent | StepEvent | GenerationResult]:
        """One reply to ``prompt``, as it is made: a :class:`TokenEvent` per token, a :class:`StepEvent` per
        draft-and-verify step, then the :class:`GenerationResult`. ``settings`` override the pair's config
        for this reply (``temperature``, ``max_tokens``, ``mode``, ``seed``, ``draft_tokens``,
        ``chat_template``, ...)."""
        config = self.engine.config.with_overrides(settings_by_name(settings))
        prepared = self.engine.encode_prompt(config, [], prompt)
        yield from self.engine.stream(prepared.tokens, self.engine.options(config), config.sampling.params())

    def generate(self, prompt: str, **settings: Any) -> GenerationResult:
        """The whole reply to ``prompt`` (see :meth:`stream`)."""
        *_, result = self.stream(prompt, **settings)
        return result

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(config: str | Path | Config | None = None, **settings: Any) -> Pair:
    """Load a pair: the config file's (default: config.yaml), with ``settings`` overriding it by name
    (``pair="demo"``, ``target=...``, ``draft="none"``, ``n_ctx=2048``, ``threads=4``...). The models must be
    in the cache already (``localspec models prepare``); nothing is downloaded here."""
    base = config if isinstance(config, Config) else load_config(config)
    return Pair(Engine(base.with_overrides(settings_by_name(settings))))
