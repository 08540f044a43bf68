"""``python -m localspec.bench sampler|kernels|gpu|ui [...]``; the end-to-end benchmark is ``localspec bench``."""

import sys


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m localspec.bench sampler [--repeats N] [--vocab V] [-k K] [--mode M]")
        print("       python -m localspec.bench kernels [--pair NAME] [--model target|draft] [--repeats N]")
        print("       python -m localspec.bench gpu --model LABEL=PATH ... [--pair TARGET:DRAFT] [--llama-bench BIN]")
        print(
            "       python -m localspec.bench ui [--prompt NAME] [--max-tokens N] [--repeats N] [--tabs N] [UI flags]"
        )
        print("       python -m localspec.bench cold [--prompts A,B] [--max-tokens N] [--repeats N] [generate flags]")
        print("       python -m localspec.bench frontends [--prompt NAME] [--max-tokens N] [--repeats N] [pair flags]")
        print("       python -m localspec.bench rpc [--rpc HOST:PORT ... | --servers N] [--delays 0,1,5] [--pair NAME]")
        print("end to end: `localspec bench` (see `localspec bench --help`)")
        return 0
    if args[0] == "sampler":
        from .sampler import main as sampler_main

        return sampler_main(args[1:])
    if args[0] == "kernels":
        from .kernels import main as kernels_main

        return kernels_main(args[1:])
    if args[0] == "ui":
        from .browser import main as browser_main

        return browser_main(args[1:])
    if args[0] == "frontends":
        from .frontends import main as frontends_main

        return frontends_main(args[1:])
    if args[0] == "rpc":
        from .rpc import main as rpc_main

        return rpc_main(args[1:])
    if args[0] == "cold":
        from .cold import main as cold_main

        return cold_main(args[1:])
    if args[0] == "gpu":
        from .gpu import main as gpu_main

        return gpu_main(args[1:])
    print(
        f"unknown benchmark {args[0]!r}; use sampler, kernels, gpu, ui, cold or frontends "
        "(end to end: `localspec bench`)",
        file=sys.stderr,
    )
    return 2


sys.exit(main())
