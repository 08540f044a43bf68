"""The chat's streaming protocol, checked without a browser: applying the operations a streaming reply is
turned into, as the page does (localspec/ui/theme.py: STREAM_JS), leaves the bubble exactly as the full render of the
finished reply, however often the page asks."""

from __future__ import annotations

import json
import random
import re

from localspec.ui.render import LiveReply, render_tokens

SPAN = re.compile(r'<span class="ls-tok[^"]*" data-status="\w+" data-i="(\d+)">.*?</span>', re.DOTALL)
BLOCK = re.compile(r'(<div class="ls-code-label"[^>]*>.*?</div>)|<pre class="ls-code"[^>]*><code>(.*?)</code></pre>|'
                   r'<span class="ls-prose"[^>]*>((?:<span class="ls-tok.*?</span>)*)</span>', re.DOTALL)  # fmt: skip


class Bubble:
    """The page's bubble as the script sees it: blocks, each a label or a list of (token index, span html)."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, list]] = []  # (opening html, spans) or (label html, None)
        self.seq, self.stale = 0, False

    @staticmethod
    def parse(blocks_html: str) -> list[tuple[str, list]]:
        found = []
        for match in BLOCK.finditer(blocks_html):
            label, code, prose = match.groups()
            if label is not None:
                found.append((label, None))
            else:
                head = match.group(0)[: match.group(0).index(">") + 1]
                found.append((head, [(int(i), m.group(0)) for m in SPAN.finditer(code if code is not None else prose)
                                     for i in [m.group(1)]]))  # fmt: skip
        return found

    def apply(self, ops: list[dict]) -> None:
        """What STREAM_JS does with one answer: operations in sequence order; a gap makes it stop."""
        for op in ops:
            if self.stale:
                return
            if op["seq"] != self.seq + 1:
                self.stale = True
                return
            drop = op["block"]
            if op["keep"] is not None:
                _head, spans = self.blocks[op["block"]]
                spans[:] = [s for s in spans if s[0] < op["keep"]]
                spans += [(int(m.group(1)), m.group(0)) for m in SPAN.finditer(op["spans"])]
                drop += 1
            del self.blocks[drop:]
            self.blocks += self.parse(op["blocks"])
            self.seq = op["seq"]

    def html(self) -> str:
        """The bubble's content as the full render writes it (block numbers aside)."""
        out = []
        for head, spans in self.blocks:
            if spans is None:
                out.append(head)
            else:
                body = "".join(s for _, s in spans)
                out.append(f"{head}<code>{body}</code></pre>" if head.startswith("<pre") else f"{head}{body}</span>")
        return re.sub(r' data-b="\d+"', "", "".join(out))


PIECES = ["Here", " is", " code", ":\n", "``", "`", "python", "\n", "def", " f", "(x", "):\n", "    return", " x",
          "\n``", "`\n", "Done", ".", " ```", "js\nlet", " a", ";\n```", " <b>&", "\n"]  # fmt: skip


def reply(seed: int, length: int) -> list[dict]:
    rng = random.Random(seed)
    statuses = ("accepted", "corrected", "bonus", "target")
    return [{"text": rng.choice(PIECES), "status": rng.choice(statuses)} for _ in range(length)]


def full(tokens: list[dict]) -> str:
    return re.sub(r' data-b="\d+"', "", render_tokens(tokens))


def test_applying_every_operation_gives_the_full_render_whatever_the_fences() -> None:
    for seed in range(40):
        tokens = reply(seed, 120)
        live, bubble = LiveReply(), Bubble()
        step = random.Random(seed).randint(1, 4)  # tokens per step, as the loop emits them
        for n in range(1, len(tokens) + 1, step):
            live.update(tokens[:n])
            bubble.apply(live.ops_after(bubble.seq))
            assert bubble.html() == full(tokens[:n]), (seed, n)
        live.update(tokens)
        bubble.apply(live.ops_after(bubble.seq))
        assert not bubble.stale and bubble.html() == full(tokens), seed
    empty = LiveReply()
    empty.update([])
    assert empty.ops_after(0) == []  # nothing to show, nothing to send


def test_a_page_that_asks_less_often_than_steps_come_gets_every_operation_since_its_last() -> None:
    tokens = reply(7, 200)
    live, bubble = LiveReply(), Bubble()
    for n in range(1, len(tokens) + 1):
        live.update(tokens[:n])  # the server notes every step ...
        if n % 6 == 0:  # ... the page asks every sixth
            answer = live.ops_after(bubble.seq)
            assert [op["seq"] for op in answer] == list(range(bubble.seq + 1, bubble.seq + 1 + len(answer)))
            bubble.apply(answer)
    bubble.apply(live.ops_after(bubble.seq))
    assert not bubble.stale and bubble.html() == full(tokens)
    gapped = Bubble()
    gapped.apply(live.ops_after(3))  # operations that do not follow what the page has: it stops applying
    assert gapped.stale and gapped.blocks == []
    # the page is sent its new tokens, not the reply: an answer's size follows what changed
    late = LiveReply()
    late.update(tokens[:190])
    seq = len(late.ops_after(0))
    late.update(tokens)
    assert len(json.dumps(late.ops_after(seq))) < len(full(tokens)) / 4
