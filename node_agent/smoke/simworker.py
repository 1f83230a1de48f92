"""One rank of a simulated smoke test: plays back a fixture's outcome through the real launcher.

It reports the same events as ``worker`` (with ``simulated: true`` and modelled durations) and
behaves like a real rank where it matters to the agent: ``timeout`` blocks in the named step until
the launcher kills the process group, ``crash`` ends the last rank with SIGSEGV while its peers
wait, ``missing`` reports an import failure, ``jit_error`` a failed kernel build, ``no_kernel_image``
CUDA's "no kernel image is available for execution on the device" in the named step. It imports
neither torch nor FlashInfer, and it refuses mnnvl under a forbidding host policy exactly as the
real worker does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from node_agent import backends, hardware, inventory, policy
from node_agent.smoke.events import EventLog
from node_agent.smoke.outcome import OutcomeKind
from node_agent.smoke.rules import failure_kind

MODELLED_STEPS = {"import": 0.0, "init": 0.0, "jit": 0.0, "workspace": 0.0, "eager": 0.0, "graph": 0.0}


def _block_forever() -> None:
    while True:
        time.sleep(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m node_agent.smoke.simworker")
    p.add_argument("--fixture", type=Path, required=True)
    p.add_argument("--backend", choices=backends.NAMES, required=True)
    p.add_argument("--benchmark", action="store_true")
    p.add_argument("--require-prebuilt", action="store_true")
    p.add_argument("--shared-gpu", action="store_true")
    args, _unknown = p.parse_known_args(argv)  # the real worker's size options do not apply

    log = EventLog.from_env()
    refused = policy.refusal(args.backend, os.environ)
    if refused is not None:
        log.emit("import", "refused", error=refused)
        return 4

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    devices = [int(d) for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    doc = hardware.load_fixture(args.fixture)
    sim = doc.get("simulate") or {}
    spec: dict[str, Any] = dict((sim.get("smoke") or {}).get(args.backend) or {})
    if "outcome" in spec:
        outcome, message = str(spec["outcome"]), str(spec.get("message", ""))
    else:
        outcome, message = hardware.derived_outcome(inventory.from_dict(doc), args.backend, devices)
    step_at = str(spec.get("step", ""))
    software = sim.get("software") or {}

    def emit_ok(step: str, **fields: Any) -> None:
        log.emit(step, "ok", dt=float(spec.get(f"{step}_s", MODELLED_STEPS.get(step, 0.0))), simulated=True, **fields)

    if outcome == "missing":
        log.emit("import", "missing", error=message or "ModuleNotFoundError: No module named 'flashinfer'")
        return 3
    emit_ok(
        "import",
        versions={"torch": software.get("torch", "simulated"), "flashinfer": software.get("flashinfer", "simulated")},
    )
    emit_ok("init", world_size=world)

    if outcome == "not_prebuilt":
        log.emit("jit", "not_prebuilt", error=message or "trtllm_comm is not in the JIT cache")
        return 1
    if outcome == "jit_error":
        error = message or "RuntimeError: Ninja build failed: trtllm_comm (simulated compile error)"
        log.emit("jit", "fail", kind=failure_kind("jit", error), error=error)
        return 1
    emit_ok("jit", cached=bool(spec.get("jit_cached", True)), source="simulated")

    for step in ("workspace", "eager", "graph"):
        failing_here = step_at == step or (not step_at and _default_step(outcome) == step)
        if failing_here and outcome == "timeout":
            log.emit(step, "start")
            _block_forever()
        if failing_here and outcome == "crash":
            log.emit(step, "start")
            if rank == world - 1:
                os.kill(os.getpid(), signal.SIGSEGV)
            _block_forever()
        if failing_here and outcome in ("fail", "null_mc_ptr", "numerics", "no_kernel_image"):
            kinds: dict[str, OutcomeKind] = {"fail": "error", "null_mc_ptr": "null_mc_ptr", "numerics": "numerics"}
            kind = kinds.get(outcome, "error")
            default = {
                "fail": "simulated failure",
                "null_mc_ptr": "the mnnvl workspace was created with a null multicast pointer (mc_ptr == 0); "
                "no kernel was run",
                "numerics": "eager call 1: values differ from the reference sum",
                "no_kernel_image": "AcceleratorError: CUDA error: no kernel image is available for execution on "
                "the device",
            }[outcome]
            error = message or default
            log.emit(step, "fail", kind=failure_kind(step, error, kind), error=error)
            return 1
        fields: dict[str, Any] = {}
        if step in ("eager", "graph"):
            fields = {"checks": 3, "max_abs_err": 0.0}
        if step == "workspace" and backends.spec(args.backend).needs_multicast:
            fields = {"mc_ptr_nonnull_all_ranks": True}
        emit_ok(step, **fields)

    latency = spec.get("latency_us") or {}
    if not args.shared_gpu:  # ranks sharing a GPU time nothing, as in the real worker
        log.emit("timing", "ok", dt=0.0, simulated=True, **{k: float(v) for k, v in latency.items()})
        if args.benchmark and spec.get("bench"):
            log.emit("benchmark", "ok", dt=0.0, simulated=True, points=list(spec["bench"]))
    log.emit("done", "done")
    return 0


def _default_step(outcome: str) -> str:
    return {"null_mc_ptr": "workspace", "fail": "workspace", "numerics": "eager", "crash": "workspace",
            "timeout": "graph", "no_kernel_image": "eager"}.get(outcome, "")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
