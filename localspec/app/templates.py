"""Chat formatting with the model's own template, rendered in a sandbox.

GGUF files carry the Jinja chat template of the original model. Rendering it
in an immutable sandbox means a hostile template can compute text but cannot
reach Python objects or the file system. Messages are plain text only: the
UI's coloured markup never reaches a prompt.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.core.errors import ConfigError, ModelError

ROLES = ("system", "user", "assistant")


@dataclass
class Message:
    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"message role {self.role!r} is unknown; use one of {', '.join(ROLES)}")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """A compiled chat template plus the special-token texts it refers to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", model_name: str = "model") -> None:
        self.source = source
        self.model_name = model_name
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: _dt.datetime.now().strftime(fmt)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        try:
            self._template = env.from_string(source)
        except TemplateError as error:
            raise ModelError(f"the chat template of {model_name} does not compile ({error}); use --raw") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True, **extra: Any) -> str:
        try:
            return self._template.render(
                messages=[m.as_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError as error:
            raise ConfigError(f"the chat template of {self.model_name} refused these messages: {error}") from None


def build_messages(system_prompt: str, history: Sequence[tuple[str, str]], user: str) -> list[Message]:
    """System prompt + (user, assistant) turns + the new user message, all plain text."""
    messages = [Message("system", system_prompt)] if system_prompt else []
    for question, answer in history:
        messages.append(Message("user", question))
        messages.append(Message("assistant", answer))
    messages.append(Message("user", user))
    return messages
