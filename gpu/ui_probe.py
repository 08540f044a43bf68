"""`localspec ui --api` on a GPU pair, asked one reply through gradio_client on the page's own endpoint (/chat);
then the target alone's rate through that endpoint (which keeps every row's top-10 for the page's evidence)
against the API's (which does not), on the same loaded pair, in turn. Prints how many tokens streamed, their
fates and both rates.

python gpu/ui_probe.py TARGET.gguf DRAFT.gguf [more `localspec ui` flags]
"""

import collections
import re
import socket
import statistics
import subprocess
import sys
import time

from gradio_client import Client

from localspec.bench.browser import api_reply

FATE = re.compile(r'data-status="(\w+)"')
RATE = re.compile(r'data-stat="tps"><div class="ls-card-v">([\d.]+)<')
RATE_TOKENS, RATE_REPEATS = 128, 2

with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
command = [sys.executable, "-m", "localspec", "ui", "--target", sys.argv[1], "--draft", sys.argv[2],
           "--port", str(port), "--api", "--max-tokens", "24", *sys.argv[3:]]  # fmt: skip
ui = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
try:
    for line in ui.stdout:  # the UI says when it answers
        print(line, end="")
        if line.startswith("localspec UI: "):
            break
    else:
        sys.exit(f"the UI exited with {ui.wait()}")
    started = time.perf_counter()
    client = Client(f"http://127.0.0.1:{port}", verbose=False)
    # message, mode, temperature, top-k, top-p, min-p, K, seed, max tokens, system prompt, adaptive K off
    job = client.submit("Say hello.", "rejection", 0.7, 0, 1.0, 0.0, 4, 1, 24, "", False, api_name="/chat")
    updates = list(job)
    chat_html, _, notice = job.outputs()[-1]
    fates = collections.Counter(FATE.findall(chat_html))
    if not fates:
        sys.exit(f"no token came back (notice: {notice!r})")
    seconds = time.perf_counter() - started
    first = f"{sum(fates.values())} tokens in {len(updates)} updates, {seconds:.2f} s: {dict(fates)}"
    page, api = [], []
    for seed in range(1, RATE_REPEATS + 2):  # the first round warms up and is not kept
        job = client.submit("Tell me about the moon.", "target-only", 0.0, 0, 1.0, 0.0, 4, seed, RATE_TOKENS, "",
                            False, api_name="/chat")  # fmt: skip
        rate = float(RATE.search(job.result()[1]).group(1))
        reply = api_reply(f"http://127.0.0.1:{port}", "Tell me about the moon.", "target-only", seed, RATE_TOKENS, seed)
        print(f"target alone, {RATE_TOKENS} tokens: page's endpoint {rate:.1f} tok/s, API {reply.engine_tps:.1f}")
        if seed > 1:
            page.append(rate)
            api.append(reply.engine_tps)
    rates = (
        f"the target alone at {statistics.median(page):.1f} tok/s through the page's endpoint, "
        f"{statistics.median(api):.1f} through the API ({statistics.median(page) / statistics.median(api):.2f})"
    )
    print(f"ok: {first}; {rates}")
finally:
    ui.terminate()
    ui.wait(timeout=30)
