"""`localspec serve` on a GPU pair, asked one chat completion over HTTP; prints the reply's first words.

python gpu/serve_probe.py TARGET.gguf DRAFT.gguf [more `localspec serve` flags]
"""

import socket
import subprocess
import sys
import time

import httpx

with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
command = [sys.executable, "-m", "localspec", "serve", "--target", sys.argv[1], "--draft", sys.argv[2],
           "--port", str(port), *sys.argv[3:]]  # fmt: skip
server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
try:
    for line in server.stdout:  # the server says when it is ready
        print(line, end="")
        if "http://" in line:
            break
    else:
        sys.exit(f"the server exited with {server.wait()}")
    started = time.perf_counter()
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 24})  # fmt: skip
    reply.raise_for_status()
    text = reply.json()["choices"][0]["message"]["content"]
    print(f"ok: {len(text)} characters in {time.perf_counter() - started:.2f} s: {text[:60]!r}")
finally:
    server.terminate()
    server.wait(timeout=30)
