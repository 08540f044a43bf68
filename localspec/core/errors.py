"""One small exception hierarchy.

Every error a user can cause derives from :class:`LocalspecError`. Front ends
(CLI, terminal chat, Gradio) catch this one class and show ``str(error)`` as a
single line, so each message names the bad value *and* the fix.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """Base class: a problem the user can fix; shown as one line, no traceback."""


class ConfigError(LocalspecError):
    """A config key or command-line value is unknown or out of range."""


class ModelError(LocalspecError):
    """A model file is missing, not GGUF, truncated, or failed to load."""


class OutOfMemoryError(ModelError):
    """A model or its context does not fit in its device's free memory (a GPU's, or RAM); what is loaded
    already may be what fills it, so a swap releases the old model and tries again."""


class IncompatiblePairError(LocalspecError):
    """Target and draft cannot be used together (vocabulary, special tokens, memory type)."""


class PromptTooLongError(LocalspecError):
    """The prompt does not fit in the context window."""


class RpcServerError(LocalspecError):
    """An RPC endpoint does not answer, answers another protocol, lacks memory, or stopped answering: the
    machine holding the target's layers, not the request, is at fault (the API answers 503)."""


class SamplingError(LocalspecError):
    """A sampling transform left no token with non-zero probability."""
