"""Hardware access behind one interface, with a real and a simulated implementation.

``NvmlHardware`` reads the live host (NVML + CUDA driver in a child process) and runs the real
smoke-test worker (torch + FlashInfer, in child processes). ``SimulatedHardware`` plays back a
recorded or modelled host from a JSON fixture through the same child processes: the inventory
comes from ``native_probe --replay`` and the smoke ranks are ``node_agent.smoke.simworker``
processes, so the launcher, its timeouts and process-group kills, the verdict and the publisher run
unchanged in tests and in the local demo.

A fixture may carry a ``simulate`` block::

    "simulate": {
      "nvml": "ok" | "missing",                       # missing: host without a driver
      "native_probe": "ok" | "crash" | "hang",        # the NVML/CUDA reader segfaults or hangs
      "software": {"torch": "2.11.0", "flashinfer": "0.6.13"},   # null = not installed
      "smoke": {                                      # per backend; absent = derived (below)
        "trtllm": {"outcome": "pass" | "fail" | "null_mc_ptr" | "numerics" | "timeout" | "crash"
                              | "missing" | "not_prebuilt" | "jit_error" | "no_kernel_image",
                   "step": "graph",                   # workspace | eager | graph: where it happens
                   "message": "...", "jit_s": 0.0,
                   "bench": [{"hidden": 8192, "tokens": 1, "nccl_us": 55.0, "backend_us": 20.0}]}
      }
    }

``load_fixture`` checks every field it plays back (types, allowed values, non-negative
durations); a malformed fixture is a ``FixtureError``, which the CLI reports with exit code 2.

Without an explicit outcome the simulated smoke test follows a small, documented model:
trtllm passes when every pair of GPUs under test has P2P (NVLink, or PCIe read+write) and every
GPU is SM 9.x/10.x (the compute capabilities FlashInfer compiles its comm kernels for,
``inventory.COMM_KERNEL_GENERATIONS``); mnnvl passes when, in addition,
``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` reads 1 on every GPU, and otherwise ends like FlashInfer
0.6.13 on such hosts: a workspace with a null multicast pointer.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import fiar_contract as contract
from node_agent import backends, childproc, inventory
from node_agent.errors import FixtureError, NativeProbeFailed, NvmlUnavailable
from node_agent.native_probe import EXIT_NVML_UNAVAILABLE
from node_agent.schema import short

FIXTURES = Path(__file__).resolve().parent / "fixtures"
"""Recorded and modelled hosts shipped with the agent."""

SMOKE_OUTCOMES = (
    "pass", "fail", "null_mc_ptr", "numerics", "timeout", "crash", "missing", "not_prebuilt", "jit_error",
    "no_kernel_image",
)  # fmt: skip


class Hardware(Protocol):
    """Everything the probe needs from a host."""

    @property
    def description(self) -> str:
        """``nvml`` or ``simulated (<fixture>)``; goes into the report."""
        ...

    @property
    def simulated(self) -> bool: ...

    def read_inventory(self, timeout_s: float = 60.0) -> inventory.Inventory:
        """Read GPUs, links, fabric and CUDA attributes. Raises ``HardwareError``."""
        ...

    def driver_version(self) -> str | None:
        """A cheap read of the driver version, for change detection; None if unknown."""
        ...

    def host_environment(self) -> Mapping[str, str]:
        """The host-policy variables of the host the probe is about."""
        ...

    def software_versions(self) -> dict[str, str | None]:
        """torch and FlashInfer versions, without importing either."""
        ...

    def smoke_worker(self, backend: contract.Backend) -> list[str]:
        """argv of one smoke-test rank for ``backend`` (the launcher adds common options)."""
        ...


def _read_child(argv: Sequence[str], timeout_s: float, what: str) -> dict[str, Any]:
    result = childproc.run_child(
        argv, env=childproc.child_env({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}), timeout_s=timeout_s
    )
    if result.timed_out:
        raise NativeProbeFailed(f"{what} did not answer within {timeout_s:.0f}s; its process group was killed")
    if result.signal_name is not None:
        raise NativeProbeFailed(f"{what} crashed with {result.signal_name} (contained in a child process)")
    if result.returncode == EXIT_NVML_UNAVAILABLE:
        try:
            message = json.loads(result.stdout)["error"]
        except (ValueError, KeyError, TypeError):
            message = result.stdout.strip()
        raise NvmlUnavailable(str(message))
    if result.returncode != 0:
        raise NativeProbeFailed(f"{what} exited with code {result.returncode}: {result.stderr_tail()}")
    try:
        doc = json.loads(result.stdout)
    except ValueError as exc:
        raise NativeProbeFailed(f"{what} printed no JSON: {result.stdout[:200]!r}") from exc
    if not isinstance(doc, dict):
        raise NativeProbeFailed(f"{what} printed {type(doc).__name__}, not an object")
    return doc


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class NvmlHardware:
    """The live host: NVML and the CUDA driver, read in a child process."""

    description = "nvml"
    simulated = False

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ if environ is not None else os.environ

    def read_inventory(self, timeout_s: float = 60.0) -> inventory.Inventory:
        doc = _read_child([sys.executable, "-m", "node_agent.native_probe"], timeout_s, "the NVML/CUDA probe")
        try:
            return inventory.from_dict(doc)
        except FixtureError as exc:
            raise NativeProbeFailed(f"the NVML/CUDA probe printed an unexpected document: {exc}") from exc

    def read_raw(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The native probe's document as printed (for ``fiar-agent inventory``)."""
        return _read_child([sys.executable, "-m", "node_agent.native_probe"], timeout_s, "the NVML/CUDA probe")

    def driver_version(self) -> str | None:
        # The kernel module's version needs no native call at all.
        for path in ("/sys/module/nvidia/version",):
            try:
                return Path(path).read_text().strip() or None
            except OSError:
                pass
        try:
            doc = _read_child(
                [sys.executable, "-m", "node_agent.native_probe", "--driver-only"], 30.0, "the driver probe"
            )
        except (NativeProbeFailed, NvmlUnavailable):
            return None
        value = doc.get("driver_version")
        return str(value) if value else None

    def host_environment(self) -> Mapping[str, str]:
        return {k: self._environ[k] for k in contract.HOST_POLICY_ENV if k in self._environ}

    def software_versions(self) -> dict[str, str | None]:
        return {"torch": _version("torch"), "flashinfer": _version("flashinfer-python")}

    def smoke_worker(self, backend: contract.Backend) -> list[str]:
        return [sys.executable, "-m", "node_agent.smoke.worker", "--backend", backend]


def load_fixture(path: Path) -> dict[str, Any]:
    """Read and validate a fixture; raises ``FixtureError`` with a clear message."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise FixtureError(f"simulated host {path}: no such file") from exc
    except (OSError, ValueError) as exc:
        raise FixtureError(f"simulated host {path}: {exc}") from exc
    except RecursionError as exc:
        raise FixtureError(f"simulated host {path}: JSON nested too deeply") from exc
    if not isinstance(doc, dict):
        raise FixtureError(f"simulated host {path}: expected a JSON object")
    try:
        inventory.from_dict(doc)
        check_simulate(doc.get("simulate"))
        _optional_str(doc.get("torch"), "torch")
    except FixtureError as exc:
        raise FixtureError(f"simulated host {path}: {exc}") from exc
    if doc.get("modelled") and not doc.get("models"):
        raise FixtureError(f"simulated host {path}: a modelled host must cite the report it models ('models')")
    return doc


SIMULATED_NATIVE_PROBE = ("ok", "crash", "hang")
SIMULATED_NVML = ("ok", "missing")
SIMULATED_STEPS = ("workspace", "eager", "graph")
"""Steps a simulated timeout, crash or failure can happen in (``simworker``)."""


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FixtureError(f"{where}: expected an object, got {short(value)}")
    return value


def _optional_str(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise FixtureError(f"{where}: expected a string or null, got {short(value)}")


def _seconds(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise FixtureError(f"{where}: expected a non-negative number, got {short(value)}")


def _one_of(value: Any, allowed: Sequence[str], where: str) -> None:
    if value not in allowed:
        raise FixtureError(f"{where}: {short(value)} is not one of {tuple(allowed)}")


def check_simulate(raw: Any) -> None:
    """Validate a fixture's ``simulate`` block (see the module docstring); raises ``FixtureError``."""
    sim = _object(raw, "simulate")
    _one_of(sim.get("nvml", "ok"), SIMULATED_NVML, "simulate.nvml")
    _one_of(sim.get("native_probe", "ok"), SIMULATED_NATIVE_PROBE, "simulate.native_probe")
    for name, version in _object(sim.get("software"), "simulate.software").items():
        _optional_str(version, f"simulate.software.{name}")
    for backend, raw_spec in _object(sim.get("smoke"), "simulate.smoke").items():
        where = f"simulate.smoke.{backend}"
        if backend not in contract.BACKENDS:
            raise FixtureError(f"{where}: unknown backend")
        spec = _object(raw_spec, where)
        outcome = spec.get("outcome", "pass")
        if outcome not in SMOKE_OUTCOMES:
            raise FixtureError(f"{where}.outcome {short(outcome)} is not one of {SMOKE_OUTCOMES}")
        if "step" in spec:
            _one_of(spec["step"], SIMULATED_STEPS, f"{where}.step")
        if "message" in spec and not isinstance(spec["message"], str):
            raise FixtureError(f"{where}.message: expected a string, got {short(spec['message'])}")
        if "jit_cached" in spec and not isinstance(spec["jit_cached"], bool):
            raise FixtureError(f"{where}.jit_cached: expected true or false, got {short(spec['jit_cached'])}")
        for key, value in spec.items():
            if key.endswith("_s"):
                _seconds(value, f"{where}.{key}")
        for key, value in _object(spec.get("latency_us"), f"{where}.latency_us").items():
            _seconds(value, f"{where}.latency_us.{key}")
        bench = spec.get("bench") or []
        if not isinstance(bench, list):
            raise FixtureError(f"{where}.bench: expected a list, got {short(bench)}")
        for i, point in enumerate(bench):
            pw = f"{where}.bench[{i}]"
            point = _object(point, pw)
            for key in ("hidden", "tokens"):
                value = point.get(key)
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise FixtureError(f"{pw}.{key}: expected a positive integer, got {short(value)}")
            for key in ("nccl_us", "backend_us", "backend_graph_us"):
                if key in point or key != "backend_graph_us":
                    _seconds(point.get(key), f"{pw}.{key}")


def resolve_fixture(name: str | Path) -> Path:
    """A path as given, or the name of a fixture shipped in ``node_agent/fixtures``."""
    path = Path(name)
    if path.exists():
        return path
    for candidate in (FIXTURES / path.name, FIXTURES / f"{path.name}.json"):
        if candidate.exists():
            return candidate
    shipped = ", ".join(sorted(p.stem for p in FIXTURES.glob("*.json")))
    raise FixtureError(f"simulated host {name}: no such file (shipped fixtures: {shipped})")


def derived_outcome(inv: inventory.Inventory, backend: contract.Backend, devices: Sequence[int]) -> tuple[str, str]:
    """The documented model of a smoke test when a fixture names no outcome: (outcome, message)."""
    gpus = [g for g in inv.gpus if g.index in devices]
    for g in gpus:
        if g.cc is None or not inventory.has_comm_kernels(g.cc):
            majors = "/".join(f"{m}.x" for m in inventory.COMM_KERNEL_GENERATIONS)
            return "fail", f"GPU {g.index} is SM {g.cc_str}; FlashInfer builds its comm kernels for SM {majors} only"
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            if not inv.any_p2p(a, b):
                return "fail", f"no P2P between GPU {a} and GPU {b}: the workspace cannot map peer buffers"
    if backends.spec(backend).needs_multicast:
        for g in gpus:
            if g.cuda is None or g.cuda.multicast_supported != 1:
                return (
                    "null_mc_ptr",
                    f"GPU {g.index} does not report multicast; the workspace's multicast pointer is null",
                )
    return "pass", ""


class SimulatedHardware:
    """A recorded or modelled host from a JSON fixture, played back through the real child processes."""

    simulated = True

    def __init__(self, path: Path) -> None:
        self.path = resolve_fixture(path).resolve()
        self._doc = load_fixture(self.path)

    @property
    def description(self) -> str:
        kind = "modelled" if self._doc.get("modelled") else "recorded"
        return f"simulated ({kind} host {self.path.name})"

    @property
    def fixture(self) -> dict[str, Any]:
        return self._doc

    def reload(self) -> None:
        """Read the fixture again (tests change it on disk to model a driver update)."""
        self._doc = load_fixture(self.path)

    def read_inventory(self, timeout_s: float = 60.0) -> inventory.Inventory:
        self.reload()
        doc = _read_child(
            [sys.executable, "-m", "node_agent.native_probe", "--replay", str(self.path)],
            timeout_s,
            "the NVML/CUDA probe",
        )
        return inventory.from_dict(doc)

    def driver_version(self) -> str | None:
        try:
            self.reload()
        except FixtureError:
            return None
        value = self._doc.get("driver_version")
        return str(value) if value else None

    def host_environment(self) -> Mapping[str, str]:
        env = self._doc.get("env") or {}
        return {k: str(v) for k, v in env.items() if k in contract.HOST_POLICY_ENV}

    def software_versions(self) -> dict[str, str | None]:
        sim = self._doc.get("simulate") or {}
        software = sim.get("software")
        if isinstance(software, dict):
            return {"torch": software.get("torch"), "flashinfer": software.get("flashinfer")}
        return {"torch": self._doc.get("torch", "simulated"), "flashinfer": "simulated"}

    def smoke_worker(self, backend: contract.Backend) -> list[str]:
        return [sys.executable, "-m", "node_agent.smoke.simworker", "--fixture", str(self.path), "--backend", backend]
