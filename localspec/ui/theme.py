"""Look of the app: CSS for token fates (docs/design.md, Visual language), chat bubbles and panels, plus the
token-click script.

Kept as Python strings (not asset files) so a plain ``pip install`` of the
package carries them. Fonts are the system's: the page must not fetch
anything from the network (no web fonts).
"""

from __future__ import annotations

CSS = """
:root {
  --ls-acc: #16a34a; --ls-acc-bg: rgba(22,163,74,.16);
  --ls-cor: #ea580c; --ls-cor-bg: rgba(234,88,12,.20);
  --ls-bon: #2563eb; --ls-bon-bg: rgba(37,99,235,.17);
}
.gradio-container { max-width: 1400px !important; margin: 0 auto; }
#ls-header { display:flex; align-items:baseline; gap:14px; flex-wrap:wrap; padding: 4px 2px 0; }
#ls-header .ls-title { font-size: 1.55rem; font-weight: 750; letter-spacing: -.02em; }
#ls-header .ls-title span { color: var(--ls-acc); }
#ls-header .ls-sub { color: var(--body-text-color-subdued); font-size: .92rem; }
.ls-badge { display:inline-block; margin-top: 10px; font-size:.82rem; padding:3px 10px; border-radius:999px;
  border:1px solid var(--border-color-primary); background: var(--background-fill-secondary); }
.ls-where { color: var(--body-text-color-subdued); font-size: .76rem; margin-top: 3px; }

/* tokens: tint + a distinct underline style per fate, so colour is never the only cue */
.ls-tok { border-radius: 3px; padding: 0 .5px; cursor: pointer; text-decoration-thickness: 2px;
  text-underline-offset: 3px; transition: outline .1s; }
.ls-tok:hover { outline: 1.5px solid var(--body-text-color-subdued); }
.ls-accepted { background: var(--ls-acc-bg); text-decoration: underline solid var(--ls-acc) 2px !important; }
.ls-corrected { background: var(--ls-cor-bg); text-decoration: underline wavy var(--ls-cor) 1.5px !important; }
.ls-bonus { background: var(--ls-bon-bg); text-decoration: underline dotted var(--ls-bon) 2.5px !important; }
.ls-target { background: transparent; }
.ls-hl { outline: 2.5px solid #eab308 !important; background: rgba(234,179,8,.30) !important; }

.ls-legend { display:flex; flex-wrap:wrap; align-items:center; gap: 6px 16px; font-size: .86rem; padding: 2px 2px 6px; }
.ls-legend-item { display:inline-flex; gap:6px; align-items:center; }
.ls-legend-item .ls-tok { font-family: var(--font-mono); font-size: .8rem; padding: 0 5px; }
.ls-legend-text { color: var(--body-text-color-subdued); }
.ls-legend-hint { color: var(--body-text-color-subdued); font-size: .78rem; flex-basis: 100%; }

.ls-chat { display:flex; flex-direction:column; gap: 14px; padding: 14px; min-height: 440px; max-height: 62vh;
  overflow-y:auto; border:1px solid var(--border-color-primary); border-radius: 14px;
  background: var(--background-fill-secondary); }
.ls-msg { display:flex; flex-direction:column; max-width: 88%; }
.ls-user { align-self: flex-end; align-items: flex-end; }
.ls-assistant { align-self: flex-start; }
.ls-bubble { padding: 10px 14px; border-radius: 14px; line-height: 1.65; font-size: .98rem;
  white-space: pre-wrap; word-wrap: break-word; background: var(--background-fill-primary);
  border: 1px solid var(--border-color-primary); box-shadow: 0 1px 2px rgba(0,0,0,.04); }
.ls-user .ls-bubble { background: var(--color-accent-soft, #eef2ff); border-bottom-right-radius: 4px; }
.ls-assistant .ls-bubble { border-bottom-left-radius: 4px; }
.ls-waiting { color: var(--body-text-color-subdued); font-style: italic;
  animation: ls-pulse 1.6s ease-in-out infinite; }
@keyframes ls-pulse { 50% { opacity: .55; } }
.ls-spinner { display:inline-block; width: .8em; height: .8em; margin-right: .5em; vertical-align: -1px;
  border: 2px solid var(--border-color-primary); border-top-color: var(--ls-acc); border-radius: 50%;
  animation: ls-spin .9s linear infinite; }
@keyframes ls-spin { to { transform: rotate(360deg); } }
/* the cursor does not blink: an endless animation makes the compositor draw 60 frames a second for the
   whole reply, and on shared cores the model pays for it */
.ls-cursor { color: var(--ls-acc); }
/* a paragraph is a block of its own (a streamed token lays out only its own); the one the cursor
   follows stays inline so the cursor sits at the end of its text */
.ls-prose { display: block; }
.ls-prose:has(+ .ls-cursor) { display: inline; }
.ls-muted { color: var(--body-text-color-subdued); }
.ls-empty { margin: auto; max-width: 520px; text-align:center; color: var(--body-text-color-subdued); line-height:1.6; }
.ls-empty-title { font-size: 1.3rem; font-weight: 650; color: var(--body-text-color); margin-bottom: 6px; }
.ls-code-label { display:block; font-family: var(--font-mono); font-size: .72rem; color: var(--body-text-color-subdued);
  background: var(--background-fill-secondary); border:1px solid var(--border-color-primary); border-bottom:none;
  border-radius: 8px 8px 0 0; padding: 2px 10px; width: fit-content; margin-top: 6px; }
pre.ls-code { margin: 0 0 6px; padding: 10px 12px; border-radius: 0 8px 8px 8px; overflow-x:auto;
  background: var(--background-fill-secondary); border:1px solid var(--border-color-primary);
  font-family: var(--font-mono); font-size: .86rem; line-height: 1.55; white-space: pre; }
pre.ls-code .ls-tok { text-underline-offset: 4px; }
.ls-footer { display:flex; flex-wrap:wrap; gap:6px; align-items:center; margin-top: 5px; font-size: .75rem; }
.ls-chip { padding: 1px 8px; border-radius: 999px; border: 1px solid var(--border-color-primary);
  color: var(--body-text-color-subdued); }
.ls-chip-accepted { border-color: var(--ls-acc); color: var(--ls-acc); }
.ls-chip-corrected { border-color: var(--ls-cor); color: var(--ls-cor); }
.ls-chip-bonus { border-color: var(--ls-bon); color: var(--ls-bon); }
.ls-chip-error, .ls-chip-stop { border-color: #dc2626; color: #dc2626; }
.ls-meta { color: var(--body-text-color-subdued); }

.ls-notice { padding: 8px 12px; border-radius: 10px; font-size: .9rem; margin: 4px 0; }
.ls-notice-error { background: rgba(220,38,38,.10); border: 1px solid rgba(220,38,38,.45); color: #b91c1c; }
.dark .ls-notice-error { color: #fca5a5; }
.ls-notice-info { background: rgba(37,99,235,.08); border: 1px solid rgba(37,99,235,.35); }
.ls-notice-ok { background: rgba(22,163,74,.10); border: 1px solid rgba(22,163,74,.45); color: #15803d; }
.dark .ls-notice-ok { color: #86efac; }

.ls-stats { display:flex; flex-direction:column; gap: 10px; }
.ls-cards { display:grid; grid-template-columns: 1fr 1fr; gap: 8px; }
.ls-card { border:1px solid var(--border-color-primary); border-radius: 12px; padding: 8px 10px;
  background: var(--background-fill-primary); }
.ls-card-v { font-size: 1.45rem; font-weight: 700; font-variant-numeric: tabular-nums; }
.ls-card-k { font-size: .78rem; text-transform: uppercase; letter-spacing: .04em;
  color: var(--body-text-color-subdued); }
.ls-card-h { font-size: .72rem; color: var(--body-text-color-subdued); }
.ls-verdict { font-size: .85rem; padding: 8px 10px; border-radius: 10px; background: rgba(22,163,74,.08);
  border: 1px solid rgba(22,163,74,.35); }
.ls-verdict-slow { background: rgba(234,88,12,.10); border-color: rgba(234,88,12,.5); }

.ls-summary { display:flex; flex-wrap:wrap; gap: 6px; }
.ls-kv { border:1px solid var(--border-color-primary); border-radius: 8px; padding: 3px 9px; font-size: .82rem;
  background: var(--background-fill-primary); }
.ls-k { color: var(--body-text-color-subdued); margin-right: 6px; }
.ls-v { font-weight: 600; }
.ls-top-head { font-size: .95rem; margin-bottom: 6px; }
.ls-top-evidence { font-size: .85rem; color: var(--body-text-color-subdued); margin-bottom: 8px; }
.ls-top-cols, .ls-replay-cols { display:grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 14px; }
#ls-badge-box { text-align: right; }
.ls-top-title { font-weight: 650; font-size: .85rem; margin-bottom: 4px; }
table.ls-top { width: 100%; border-collapse: collapse; font-size: .84rem; table-layout: auto; margin: 0 !important; }
table.ls-top td { border-left: none !important; border-right: none !important; }
table.ls-top td { padding: 2px 6px; border-bottom: 1px solid var(--border-color-primary); }
td.ls-top-tok { font-family: var(--font-mono); white-space: pre; max-width: 160px; overflow: hidden;
  text-overflow: ellipsis; }
td.ls-top-bar { width: 38%; min-width: 70px; }
td.ls-top-bar span { display:block; height: 9px; border-radius: 4px; }
td.ls-top-p { font-variant-numeric: tabular-nums; text-align: right; white-space: nowrap; }
td.ls-top-mark { white-space: nowrap; font-size: .72rem; color: var(--body-text-color-subdued); }
tr.ls-top-chosen td { font-weight: 700; background: rgba(234,179,8,.14); }
#ls-token-pick { display: none !important; }
#ls-stream { display: none !important; }
#ls-tip { position: fixed; z-index: 1000; max-width: 460px; padding: 6px 9px; border-radius: 6px;
          background: #1f2937; color: #f9fafb; font-size: .78rem; line-height: 1.35; white-space: pre-line;
          pointer-events: none; box-shadow: 0 4px 14px rgba(0,0,0,.25); display: none; }
#ls-tip.ls-tip-on { display: block; }
"""

# The hidden stream component's js_on_load (Gradio runs it once, with ``watch`` and ``props``).
# When a reply starts, the component's value names it, and the page reads the reply's updates
# (ChatApp.updates, through a plain route: ui/app.py add_stream_routes) to its end: each line's operations
# (ui/render.py: LiveReply) are applied to the reply's bubble — keep a prefix of its blocks (and of one
# block's tokens), drop the rest, append what is new — and its stats replace the stats panel's content,
# in one task, so one frame draws both. A hovered token's evidence is asked of the server (ChatApp.evidence).
STREAM_JS = """
async function ask(what, at) {  // ui/app.py: add_stream_routes
  const answer = await fetch('localspec/' + what + '?at=' + encodeURIComponent(at));
  if (!answer.ok) throw new Error(what + ': ' + answer.status);
  return answer.text();
}
const tip = document.getElementById('ls-tip') || document.body.appendChild(Object.assign(
  document.createElement('div'), { id: 'ls-tip', role: 'tooltip' }));
let hovered = null;
document.addEventListener('mouseover', async function (event) {
  const tok = event.target.closest && event.target.closest('#ls-chat-log .ls-tok[data-i]');
  if (!tok || tok === hovered) return;
  hovered = tok;
  const reply = tok.closest('[data-reply]');
  if (!reply) return;
  if (tok.dataset.evidence === undefined) {
    try {
      tok.dataset.evidence = await ask('evidence', reply.dataset.reply + ':' + tok.dataset.i);
    } catch (e) { return; }
  }
  if (hovered !== tok || !tok.dataset.evidence) return;
  tip.textContent = tok.dataset.evidence;
  tok.setAttribute('aria-describedby', 'ls-tip');
  const box = tok.getBoundingClientRect();
  tip.classList.add('ls-tip-on');
  tip.style.left = Math.max(4, Math.min(box.left, window.innerWidth - tip.offsetWidth - 4)) + 'px';
  const below = box.bottom + 6, above = box.top - tip.offsetHeight - 6;
  tip.style.top = (below + tip.offsetHeight < window.innerHeight || above < 0 ? below : above) + 'px';
});
document.addEventListener('mouseout', function (event) {
  const tok = event.target.closest && event.target.closest('#ls-chat-log .ls-tok[data-i]');
  if (tok && tok === hovered && !tok.contains(event.relatedTarget)) {
    hovered = null; tip.classList.remove('ls-tip-on');
  }
});

function applyOp(bubble, op) {
  bubble.querySelectorAll(':scope > .ls-muted').forEach(function (e) { e.remove(); });  // "thinking…"
  const blocks = bubble.querySelectorAll(':scope > [data-b]');
  let drop = op.block;
  if (op.keep !== null) {
    const block = blocks[op.block];
    if (!block) return false;
    const box = block.querySelector('code') || block;
    for (let span = box.lastElementChild; span && +span.dataset.i >= op.keep; span = box.lastElementChild)
      span.remove();
    box.insertAdjacentHTML('beforeend', op.spans);
    drop = op.block + 1;
  }
  for (let n = blocks.length - 1; n >= drop; n--) blocks[n].remove();
  const fresh = document.createElement('template');
  fresh.innerHTML = op.blocks;
  bubble.insertBefore(fresh.content, bubble.querySelector(':scope > .ls-cursor'));
  return true;
}

function applyUpdate(reply, update, seq) {  // the sequence number of the last operation applied
  const bubble = document.querySelector('#ls-chat-log [data-reply="' + reply + '"] .ls-bubble');
  if (bubble && bubble.querySelector(':scope > .ls-cursor') && seq !== null) {  // else: the final render shows it
    for (const op of update.ops) {
      if (op.seq !== seq + 1 || !applyOp(bubble, op)) { seq = null; break; }
      seq = op.seq;
    }
  }
  const stats = update.stats && document.getElementById('ls-stats');
  if (stats) {
    const fresh = document.createElement('template');
    fresh.innerHTML = update.stats;
    stats.replaceChildren(...fresh.content.firstElementChild.childNodes);
  }
  return seq;
}

let following = null;  // the reply whose updates the page reads
async function follow(reply) {
  following = reply;
  let lines, text = '', seq = 0;
  try {
    const answer = await fetch('localspec/stream?reply=' + encodeURIComponent(reply));
    if (!answer.ok || !answer.body) return;
    lines = answer.body.pipeThrough(new TextDecoderStream()).getReader();
  } catch (e) { return; }
  for (;;) {  // to the end: a response the page leaves early tells the server it went away (the reply stops)
    let chunk;
    try { chunk = await lines.read(); } catch (e) { return; }
    if (chunk.done) return;
    text += chunk.value;
    for (let end = text.indexOf('\\n'); end >= 0; end = text.indexOf('\\n')) {
      seq = applyUpdate(reply, JSON.parse(text.slice(0, end)), seq);
      text = text.slice(end + 1);
    }
  }
}
watch('value', function () {
  let started = null;
  try { started = JSON.parse(props.value || 'null'); } catch (e) { return; }
  if (started && started.reply && started.reply !== following) follow(started.reply);
});
"""

# Run before Gradio's own scripts (ui/app.py: serve_early_script puts it first in the page's head).
# Gradio 6's status tracker keeps a timer running on every animation frame while its component is
# pending, and on this page one is pending even when nothing runs: the page drew 60 frames a second,
# idle or streaming, and on shared cores the model paid for it (docs/performance.md, "The chat UI at
# the engine's speed"). Its timer shows only where progress is shown, which is nowhere here: it ticks
# every 5 s instead (each tick also starts a short tween). Every other animation frame is left alone.
EARLY_JS = """
(function () {
  const frame = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = function (callback) {
    if ((new Error().stack || '').indexOf('statustracker') < 0) return frame(callback);
    return setTimeout(function () { callback(performance.now()); }, 5000);
  };
})();
"""

# Clicking a token in the chat writes "turn:index:nonce" into a hidden textbox; its change
# event moves the debugging view to that token. No network, no globals beyond one listener.
HEAD = """
<script>
document.addEventListener('click', function (event) {
  const tok = event.target.closest && event.target.closest('#ls-chat-log .ls-tok[data-i]');
  if (!tok) return;
  const turn = tok.closest('[data-turn]');
  const box = document.querySelector('#ls-token-pick textarea, #ls-token-pick input');
  if (!turn || !box) return;
  box.value = turn.dataset.turn + ':' + tok.dataset.i + ':' + Date.now();
  box.dispatchEvent(new Event('input', { bubbles: true }));
});
// The chat log grows with every streamed update: keep it at the newest message unless
// the reader scrolled up to read an older one (then keep their place).
(function () {
  let follow = true, lastTop = 0;
  document.addEventListener('scroll', function (event) {
    const log = event.target;
    if (!log || log.id !== 'ls-chat-log') return;
    follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 40;
    lastTop = log.scrollTop;
  }, true);
  // once per batch of changes (a streamed update is one), before the page is drawn: a layout a batch
  new MutationObserver(function () {
    const log = document.getElementById('ls-chat-log');
    if (!log) return;
    if (follow) { if (log.scrollTop + log.clientHeight < log.scrollHeight) log.scrollTop = log.scrollHeight; }
    else if (log.scrollTop !== lastTop) log.scrollTop = lastTop;
  }).observe(document.documentElement, { childList: true, subtree: true });
})();
</script>
"""
