"""localspec's own model load and one decode, in a process of its own: prints "ok ..." or dies.

    python -X faulthandler gpu/load_probe.py MODEL.gguf

The GPU check runs it before anything else; where it crashes, the check takes cuda-gdb's backtrace of it.
"""

import sys

from localspec.llama.model import LlamaModel, LlamaSettings

model = LlamaModel(sys.argv[1], LlamaSettings(n_ctx=1024), "draft")
rows = model.extend(model.tokenize("def quicksort(items):"), 1)
print("ok", model.weight_buffer_mib, model.placement.reason, rows.shape)
model.close()
