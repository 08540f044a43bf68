"""One model load (and a decode) in one of the ways that took localspec's CUDA crash apart; prints "ok ..." or dies.

    python -X faulthandler gpu/load_probe.py CASE MODEL.gguf

product: localspec's own load path (LlamaModel: loads and decodes on its compute thread). c-thread: the C API
with default parameters on a pool thread, without localspec (worked on the first look). start-thread: the
same after localspec's runtime.start() (environment, log callback, backend init); -no-log: with llama.cpp's
log callback taken away again. product-no-log, product-no-placement: LlamaModel without the log callback, or
with no placement decisions (no tensor table, no overrides). product-arena1: product with one malloc arena.
"""

import concurrent.futures
import os
import sys

case, path = sys.argv[1], sys.argv[2]
MALLOC_ENV = {  # glibc reads these at start-up: the case runs again in a process started with them
    "product-arena1": {"MALLOC_ARENA_MAX": "1"},
    "product-malloc-check": {"GLIBC_TUNABLES": "glibc.malloc.check=3", "LD_PRELOAD": "libc_malloc_debug.so.0"},
}
if case in MALLOC_ENV and not os.environ.get("LOCALSPEC_PROBE_CHILD"):
    env = {**os.environ, **MALLOC_ENV[case], "LOCALSPEC_PROBE_CHILD": "1"}
    os.execve(sys.executable, [sys.executable, "-X", "faulthandler", *sys.argv], env)


def c_load(C):
    params = C.llama_model_default_params()
    params.n_gpu_layers = -1
    model = C.llama_model_load_from_file(path.encode(), params)
    return bool(model)


def no_log():
    from localspec.llama import runtime

    runtime.start()
    runtime.C.llama_log_set(runtime.C.llama_log_callback(0), None)


if case == "c-thread":
    import llama_cpp.llama_cpp as C

    C.llama_backend_init()
    print("ok", concurrent.futures.ThreadPoolExecutor(1).submit(c_load, C).result())
elif case in ("start-thread", "start-thread-no-log"):
    from localspec.llama import runtime

    runtime.start()
    if case.endswith("no-log"):
        no_log()
    print("ok", concurrent.futures.ThreadPoolExecutor(1).submit(c_load, runtime.C).result())
else:
    from localspec.llama import model as llama_model
    from localspec.llama.placement import WeightPlacement

    if case == "product-no-log":
        no_log()
    if case == "product-no-placement":
        llama_model.choose_placement = lambda settings, role, path: WeightPlacement(True, False, "llama.cpp's defaults")
    model = llama_model.LlamaModel(path, llama_model.LlamaSettings(n_ctx=1024), "draft")
    rows = model.extend(model.tokenize("def quicksort(items):"), 1)
    print("ok", model.weight_buffer_mib, model.placement.reason, rows.shape)
    model.close()
