"""Build FlashInfer's comm kernels ahead of time, so that no node compiles on the critical path.

Run as ``python -m node_agent.smoke.prebuild --backends trtllm[,mnnvl]`` by ``fiar-agent prebuild``
(the modules: ``node_agent.backends``)
(in an init container, or at image build time with ``FLASHINFER_CUDA_ARCH_LIST`` set when no GPU
is visible). The modules land in FlashInfer's JIT cache (``$FLASHINFER_WORKSPACE_BASE/.cache/
flashinfer/<version>/<archs>/cached_ops``); keep that folder on a hostPath or in the image and the
smoke test's ``jit`` step only loads them (``--require-prebuilt`` turns a miss into a skipped test
instead of a compile). Compiling creates no multicast object; under a forbidding host policy a
backend that needs multicast is still not built, because it is never used there.

Prints ``{"modules": {name: {"source": "aot"|"jit-cache"|"compiled", "seconds": s, "path": p}}}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Any

from node_agent import backends


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m node_agent.smoke.prebuild")
    p.add_argument("--backends", default=",".join(backends.NAMES))
    args = p.parse_args(argv)
    generators: dict[str, Any] = {}
    try:
        for spec in backends.TABLE:
            generators[spec.name] = getattr(importlib.import_module(spec.module), spec.generator, None)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 3
    modules: dict[str, Any] = {}
    for backend in [b for b in args.backends.split(",") if b]:
        gen = generators.get(backend)
        if gen is None:
            modules[backend] = {"source": "unavailable", "error": "this FlashInfer has no such module generator"}
            continue
        spec = gen()
        start = time.perf_counter()
        if spec.is_aot:
            source = "aot"
        elif spec.jit_library_path.exists():
            source = "jit-cache"
        else:
            spec.build(verbose=False)
            source = "compiled"
        modules[backend] = {
            "module": spec.name,
            "source": source,
            "seconds": round(time.perf_counter() - start, 3),
            "path": str(spec.get_library_path()),
        }
    print(json.dumps({"modules": modules}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
