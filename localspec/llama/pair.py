"""Whether a draft can serve a target: same tokenizer, vocabularies of (almost) the same size."""

from __future__ import annotations

from localspec.core.errors import IncompatiblePairError
from localspec.llama.model import LlamaModel

VOCAB_SIZE_TOLERANCE = 128  # as llama.cpp's speculative example: pads differ between sizes of a family


def first_token_mismatch(target: LlamaModel, draft: LlamaModel) -> tuple[int, str, str] | None:
    """The first token id whose text differs between the two vocabularies, if any."""
    for token in range(min(target.vocab_size, draft.vocab_size)):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            return token, t_text, d_text
    return None


def check_pair(target: LlamaModel, draft: LlamaModel) -> None:
    """Refuse a draft whose tokens do not mean the same as the target's (docs/design.md, llama.cpp integration).

    Checks every token text both vocabularies have, the vocabulary type, the
    size difference and the BOS/EOS/EOT ids. The message names the first
    differing token id with both texts, so the user sees *why*.
    """
    pair = f"draft {draft.name} cannot draft for target {target.name}"
    vocabs = (
        f"vocabularies: {target.vocab_type} with {target.vocab_size} tokens vs "
        f"{draft.vocab_type} with {draft.vocab_size}"
    )
    fix = "pick a draft with the same tokenizer (same model family)"
    mismatch = first_token_mismatch(target, draft)
    if mismatch is not None:
        token, t_text, d_text = mismatch
        raise IncompatiblePairError(
            f"{pair}: token {token} is {t_text!r} in the target but {d_text!r} in the draft ({vocabs}); {fix}"
        )
    if target.vocab_type != draft.vocab_type:
        raise IncompatiblePairError(f"{pair}: vocabulary types differ ({vocabs}); {fix}")
    gap = abs(target.vocab_size - draft.vocab_size)
    if gap > VOCAB_SIZE_TOLERANCE:
        raise IncompatiblePairError(
            f"{pair}: vocabulary sizes differ by {gap}, more than {VOCAB_SIZE_TOLERANCE} ({vocabs}); {fix}"
        )
    for label, a, b in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos), ("EOT", target.eot, draft.eot)):
        if a != b:
            raise IncompatiblePairError(f"{pair}: {label} token ids differ ({a} vs {b}); {fix}")
