"""Start sglang-router or vllm-router as `python -m PACKAGE.launch_router` does, ~0.5 s sooner.

Run as a script of its own (hpcserve_runtime/router_main.py in the job directory), by the
router's launch script, with the router's Python:

    python3 hpcserve_runtime/router_main.py PACKAGE ROUTER-ARGS...

PACKAGE is sglang_router or vllm_router. Both packages' `launch_router` module imports its
debugging MiniLB at the top (FastAPI, aiohttp, orjson: 0.5-0.7 s of a 2-core host's CPU, where
the Rust router itself imports in 0.07 s), although only `--mini-lb` uses it. hpcserve never
starts the MiniLB (the plan refuses `--mini-lb`), so this puts an empty stand-in for that one
module in `sys.modules` and runs the package's own `launch_router.main()` on ROUTER-ARGS: the
same parser, the same Router. A release that no longer has that module, or that no longer
imports it there, just starts as it would have (the stand-in is never looked at).
"""

import importlib
import sys
import types


def main() -> None:
    package = sys.argv.pop(1)
    sys.argv[0] = package + ".launch_router"  # the name its usage and errors print
    stand_in = types.ModuleType(package + ".mini_lb")
    stand_in.MiniLoadBalancer = None  # imported by name; called only for --mini-lb
    sys.modules[stand_in.__name__] = stand_in
    importlib.import_module(package + ".launch_router").main()


if __name__ == "__main__":
    main()
