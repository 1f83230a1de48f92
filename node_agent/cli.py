"""``fiar-agent`` entry point: thin argument handling over ``probe``, ``daemon`` and ``hardware``.

Commands::

    fiar-agent probe      one probe of this host (or --simulate FILE); touches no Kubernetes
    fiar-agent run        the node daemon: probe, label its own Node, re-probe, serve /metrics
    fiar-agent inventory  print this host in the recorded-host JSON format (a new fixture)
    fiar-agent prebuild   build FlashInfer's comm kernels ahead of time

Exit codes of ``probe``: 0 ok (every label is backed by a completed step), 1 degraded (the probe
finished but some step could not answer: no driver, GPUs busy, torch/FlashInfer missing, kernels
not built or not loadable, a rank timed out; the reasons say which), 2 error (invalid
configuration). A degraded probe in which no test passed, failed or timed out prints no
``fiar.io/backend`` label (the daemon keeps an earlier verdict of the same hardware instead).
``run`` exits 0 after SIGTERM and 2 on invalid configuration; ``inventory`` and ``prebuild`` exit
0 on success, 1 on a failed read or build, 2 on invalid configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fiar_contract as contract
from node_agent import __version__, backends, childproc
from node_agent.daemon import DaemonConfig
from node_agent.errors import AgentError, ConfigError, HardwareError
from node_agent.hardware import Hardware, NvmlHardware, SimulatedHardware
from node_agent.policy import resolve
from node_agent.probe import ProbeConfig, ProbeResult, probe

EXIT_OK = 0
EXIT_DEGRADED = 1
EXIT_ERROR = 2

EPILOG = """exit codes (probe): 0 ok, 1 degraded (finished, but a step could not answer; see the
reasons), 2 error (invalid configuration). run: 0 after SIGTERM, 2 invalid configuration."""


def _default(cls: type[Any], name: str) -> Any:
    """The default of a config dataclass field: the one source of the option's default."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _add_probe_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--simulate", metavar="FILE", help="probe a recorded or modelled host (JSON fixture) instead of this one"
    )
    p.add_argument("--forbid-multicast", action="store_true", help="treat multicast as forbidden by host policy")
    p.add_argument("--force", action="store_true", help="run smoke tests even when the GPUs are busy")
    p.add_argument(
        "--timeout",
        type=float,
        default=_default(ProbeConfig, "timeout_s"),
        metavar="S",
        help="hard timeout of one smoke test (default %(default)g)",
    )
    p.add_argument("--gpus", type=int, metavar="N", help="ranks to test (power of two; default: all GPUs)")
    p.add_argument("--no-benchmark", action="store_true", help="skip the benchmark against NCCL allreduce")
    p.add_argument(
        "--bench-margin",
        type=float,
        default=_default(ProbeConfig, "bench_margin"),
        metavar="F",
        help="do not recommend a backend slower than NCCL by more than this fraction (default %(default).2f)",
    )
    p.add_argument(
        "--require-prebuilt",
        action="store_true",
        help="never compile kernels during a test; skip GPUs that FLASHINFER_CUDA_ARCH_LIST has no kernels for",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=_default(ProbeConfig, "iters"),
        help="timed iterations per latency measurement (default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fiar-agent",
        description="Prove which FlashInfer allreduce backend works on this node and label the node.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"fiar-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("probe", help="probe once and print the verdict (no Kubernetes)", epilog=EPILOG)
    _add_probe_options(p)
    p.add_argument("--json", action="store_true", help="print the full report (with its labels) as JSON")
    p.add_argument(
        "--shared-gpu",
        action="store_true",
        help="test hosts only: run the two-rank tests with both ranks on the first GPU (a gloo group); "
        "correctness only, no timing, and no label (the daemon has no such option)",
    )

    r = sub.add_parser(
        "run",
        help="run the node daemon",
        description="Probe this node, label its own Node, re-probe on the interval, a driver change or "
        "fiar.io/reprobe. A probe that cannot conclude (a backend could not be tested, or the GPUs could "
        "not be read) never writes fiar.io/backend=none (docs/DESIGN.md#verdict-none); the next probe then "
        "comes after --retry-interval.",
        epilog=EPILOG,
    )
    _add_probe_options(r)
    r.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="own Node (default: $NODE_NAME)")
    r.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, else in-cluster")
    d = functools.partial(_default, DaemonConfig)
    r.add_argument(
        "--interval", type=float, default=d("interval_s"), metavar="S", help="re-probe interval (default %(default)g)"
    )
    r.add_argument(
        "--retry-interval",
        type=float,
        default=d("retry_interval_s"),
        metavar="S",
        help="re-probe interval after a degraded probe (a step could not answer; busy GPUs are still not "
        "tested) (default %(default)g)",
    )
    r.add_argument(
        "--driver-check", type=float, default=d("driver_check_s"), metavar="S", help="driver-version check interval"
    )
    r.add_argument("--metrics-addr", default=d("metrics_addr"), help="HOST:PORT for /metrics and /healthz; '' disables")
    r.add_argument(
        "--api-backoff-max",
        type=float,
        default=d("api_backoff_max_s"),
        metavar="S",
        help="longest wait between API retries",
    )
    r.add_argument(
        "--kernel-cache",
        default=os.environ.get("FIAR_KERNEL_CACHE"),
        metavar="DIR",
        help="writable folder for FlashInfer's kernels, seeded at start from --kernel-seed into a subfolder "
        "keyed by the seed's contents (default: $FIAR_KERNEL_CACHE; unset: FLASHINFER_WORKSPACE_BASE as given)",
    )
    r.add_argument(
        "--kernel-seed", default=d("kernel_seed"), metavar="DIR", help="the image's prebuilt kernels (read only)"
    )

    i = sub.add_parser("inventory", help="print this host in the recorded-host JSON format")
    i.add_argument("--simulate", metavar="FILE")
    i.add_argument("--output", type=Path, help="write to this file instead of stdout")

    b = sub.add_parser("prebuild", help="build FlashInfer's comm kernels ahead of time")
    b.add_argument("--forbid-multicast", action="store_true", help="build only what a host without multicast uses")
    b.add_argument("--arch", help="FLASHINFER_CUDA_ARCH_LIST for builds without a visible GPU, e.g. '9.0a 10.0a'")
    b.add_argument("--timeout", type=float, default=1800.0, metavar="S")
    return parser


def make_hardware(simulate: str | None) -> Hardware:
    return SimulatedHardware(Path(simulate)) if simulate else NvmlHardware()


def probe_config(args: argparse.Namespace) -> ProbeConfig:
    config = ProbeConfig(
        forbid_multicast=args.forbid_multicast,
        force=args.force,
        timeout_s=args.timeout,
        gpus=args.gpus,
        benchmark=not args.no_benchmark,
        bench_margin=args.bench_margin,
        require_prebuilt=args.require_prebuilt,
        iters=args.iters,
        shared_gpu=getattr(args, "shared_gpu", False),  # `probe` only: `run` has no such option
    )
    config.validate()
    return config


def _stderr(line: str, t0: float = time.monotonic()) -> None:
    print(f"[{time.monotonic() - t0:7.1f}s] {line}", file=sys.stderr, flush=True)


def summary(result: ProbeResult) -> str:
    verdict = result.verdict
    lines = [f"fiar-agent probe: {verdict.status} ({round(result.duration_s, 3):.1f}s, {result.hardware})", "labels:"]
    lines += [f"  {k}={v}" for k, v in verdict.labels.items()]
    lines.append("reasons:")
    lines += [f"  - {r}" for r in verdict.reasons]
    for name in contract.BACKENDS:
        test = result.tests[name]
        if test.result == "skipped":
            continue
        m = test.measured
        steps = ", ".join(f"{k} {v:.2f}s" for k, v in m.steps.items())
        devices = list(test.devices) if test.devices else None
        lines.append(f"{name}: {test.result} on GPUs {devices}; {steps}")
        if m.jit:
            jit = m.jit
            lines.append(f"  jit: {jit.get('source', '?')} in {jit.get('seconds', 0):.2f}s (apart from the test)")
        if m.latency_us:
            lines.append("  latency: " + ", ".join(f"{k} {v:.1f}" for k, v in m.latency_us.items()))
        if m.bench:
            lines.append("  hidden  tokens   NCCL us  backend us  graph us  ratio")
            for p in m.bench:
                g = f"{p.backend_graph_us:8.1f}" if p.backend_graph_us is not None else "       -"
                ratio = p.backend_us / p.nccl_us if p.nccl_us else float("inf")
                sizes = f"  {p.hidden:6d}  {p.tokens:6d}"
                lines.append(f"{sizes}  {p.nccl_us:8.1f}  {p.backend_us:10.1f}  {g}  {ratio:5.2f}")
    return "\n".join(lines)


def cmd_probe(args: argparse.Namespace) -> int:
    config = probe_config(args)
    hw = make_hardware(args.simulate)
    result = probe(hw, config, progress=_stderr)
    if args.json:
        json.dump(result.report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(summary(result))
    return result.exit_code


def cmd_inventory(args: argparse.Namespace) -> int:
    hw = make_hardware(args.simulate)
    try:
        if isinstance(hw, NvmlHardware):
            doc: dict[str, Any] = hw.read_raw()
        else:
            from node_agent import inventory

            doc = inventory.to_dict(hw.read_inventory())
    except HardwareError as exc:
        print(f"fiar-agent inventory: {exc}", file=sys.stderr)
        return EXIT_DEGRADED
    text = json.dumps(doc, indent=1) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_prebuild(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    policy = resolve([("env", os.environ)], args.forbid_multicast)
    names = [b.name for b in backends.allowed(policy.multicast_forbidden)]
    extra = {k: v for name in names for k, v in policy.child_env(name).items()}  # one child builds them all
    if args.arch:
        extra["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
    _stderr(f"prebuild: {', '.join(names)} (a cold build takes minutes)")
    result = childproc.run_child(
        [sys.executable, "-m", "node_agent.smoke.prebuild", "--backends", ",".join(names)],
        env=childproc.child_env(extra),
        timeout_s=args.timeout,
    )
    if not result.ok:
        why = "timed out" if result.timed_out else (result.signal_name or f"exit {result.returncode}")
        print(f"fiar-agent prebuild: failed ({why}): {result.stdout.strip()} {result.stderr_tail()}", file=sys.stderr)
        return EXIT_DEGRADED
    sys.stdout.write(result.stdout)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    faulthandler.enable()  # a fatal signal prints every thread's Python stack to the log
    from node_agent import daemon

    config = daemon.DaemonConfig.from_args(args, probe_config(args))
    return daemon.main(config, make_hardware(args.simulate))


COMMANDS = {"probe": cmd_probe, "inventory": cmd_inventory, "prebuild": cmd_prebuild, "run": cmd_run}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"fiar-agent {args.command}: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except AgentError as exc:
        print(f"fiar-agent {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
