"""localspec: exact speculative decoding for local GGUF models through llama.cpp.

From Python, load a pair once and ask it for replies; settings are the config file's, by name::

    >>> import localspec
    >>> with localspec.load(pair="demo", n_ctx=1024, threads=1) as pair:
    ...     reply = pair.generate("The capital of France is", max_tokens=8, temperature=0, chat_template=False)
    ...     alone = pair.generate("The capital of France is", max_tokens=8, temperature=0, chat_template=False,
    ...                           mode="target-only")
    ...     fates = [event.status.value for event in pair.stream("Hi", max_tokens=4) if event.kind == "token"]
    >>> reply.text == alone.text  # greedy speculative output is the target's own, byte for byte
    True
    >>> len(fates), set(fates) <= {"accepted", "corrected", "bonus", "target"}
    (4, True)

``load`` returns a :class:`localspec.library.Pair`; ``stream`` yields the
events every front end shows (:class:`TokenEvent`, :class:`StepEvent`, then the
:class:`GenerationResult`). The models come from the cache that ``localspec
models prepare`` (or ``make run``) fills.
"""

__version__ = "0.1.0"
__all__ = ["load", "Pair", "TokenEvent", "StepEvent", "GenerationResult", "LocalspecError"]


def __getattr__(name: str):
    """The API is imported on first use, so the command line's start-up does not pay for it."""
    if name in ("load", "Pair"):
        from localspec import library

        return getattr(library, name)
    if name in ("TokenEvent", "StepEvent", "GenerationResult"):
        from localspec.core import events

        return getattr(events, name)
    if name == "LocalspecError":
        from localspec.core.errors import LocalspecError

        return LocalspecError
    raise AttributeError(f"module 'localspec' has no attribute {name!r}")
