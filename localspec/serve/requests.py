"""What an OpenAI-style request asks for, checked, and turned into localspec settings.

Fields are read as OpenAI clients send them (``max_tokens`` or
``max_completion_tokens``, ``stop`` as a string or a list, ``stream_options``),
plus localspec's own in the same body (``top_k``, ``min_p``, ``mode``,
``draft_tokens``, ``adaptive``, ``trace``). A wrong type is a 422, a value
out of range a 400 naming the field, like every other bad setting in
localspec (the ranges are the config's declarations).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localspec.app.config import Config
from localspec.core.errors import ConfigError


class ApiError(Exception):
    """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text (a list of content parts: their text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"content part of type {part.get('type')!r} is not supported; send text",
                               "messages", "unsupported_content")  # fmt: skip
            parts.append(part["text"])
        return "".join(parts)


class _Common(BaseModel):
    """Fields both endpoints take. Unknown fields are ignored, as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # localspec's own
    top_k: int | None = None
    min_p: float | None = None
    mode: str | None = None
    draft_tokens: int | None = None
    adaptive: bool | None = None
    trace: bool = False  # save the reply's JSONL trace (the Debugging view loads it) and return its path

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise ApiError(400, "stop sequences must not be empty", "stop")
        return tuple(stops)

    def config(self, base: Config) -> Config:
        """``base`` with this request's settings; out-of-range values are a 400 naming the field."""
        if self.n != 1:
            raise ApiError(400, f"n = {self.n} is not supported; localspec generates one choice (n = 1)", "n")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        fields = {
            "sampling.max_tokens": ("max_tokens", limit),
            "sampling.temperature": ("temperature", self.temperature),
            "sampling.top_p": ("top_p", self.top_p),
            "sampling.top_k": ("top_k", self.top_k),
            "sampling.min_p": ("min_p", self.min_p),
            "sampling.presence_penalty": ("presence_penalty", self.presence_penalty),
            "sampling.frequency_penalty": ("frequency_penalty", self.frequency_penalty),
            "sampling.seed": ("seed", self.seed),
            "speculative.mode": ("mode", self.mode),
            "speculative.draft_tokens": ("draft_tokens", self.draft_tokens),
            "speculative.adaptive": ("adaptive", self.adaptive),
        }
        config = base
        for key, (param, value) in fields.items():
            if value is None:
                continue
            try:
                config = config.with_overrides({key: value})
            except ConfigError as error:
                raise ApiError(400, f"{param}: {error}", param) from None
        return config


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Common):
    prompt: str


def parse(model: type[BaseModel], body: bytes) -> Any:
    """The request body as ``model``: malformed JSON is a 400, a wrong field type a 422 naming the field."""
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"the request body is not valid JSON ({error})", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise ApiError(422, f"{param}: {first.get('msg')}", param, "invalid_type") from None
