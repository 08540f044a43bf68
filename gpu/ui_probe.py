"""`localspec ui` on a GPU pair, asked one reply through gradio_client on the page's own endpoint (/chat);
prints how many tokens streamed and their fates.

python gpu/ui_probe.py TARGET.gguf DRAFT.gguf [more `localspec ui` flags]
"""

import collections
import re
import socket
import subprocess
import sys
import time

from gradio_client import Client

FATE = re.compile(r'data-status="(\w+)"')

with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
command = [sys.executable, "-m", "localspec", "ui", "--target", sys.argv[1], "--draft", sys.argv[2],
           "--port", str(port), "--max-tokens", "24", *sys.argv[3:]]  # fmt: skip
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
    print(f"ok: {sum(fates.values())} tokens in {len(updates)} updates, {time.perf_counter() - started:.2f} s: "
          f"{dict(fates)}")  # fmt: skip
finally:
    ui.terminate()
    ui.wait(timeout=30)
