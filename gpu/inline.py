"""Run a localspec module with llama.cpp's calls made on the caller's own thread instead of the compute thread.

    python gpu/inline.py -m localspec.bench gpu ...

Only for the GPU check, where the compute thread crashed: the measurements can still be taken.
"""

import runpy
import sys

from localspec.llama import runtime

runtime.ComputeThread.run = lambda self, fn, *args: fn(*args)
if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
    sys.exit("usage: python gpu/inline.py -m MODULE [ARGS...]")
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
