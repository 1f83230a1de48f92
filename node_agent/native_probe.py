"""Child process that reads NVML and the CUDA driver and prints the host in the recorded format.

Run as ``python -m node_agent.native_probe`` by ``node_agent.hardware``, never imported by the
resident agent for its side effects: NVML and libcuda calls can crash the calling process (passing
the fabric-info struct by value segfaults; it must go through ``ctypes.byref``), so they run here,
where a crash is an exit status the parent reports.

Everything is read-only. ``cuInit`` plus ``cuDeviceGetAttribute`` need no context and allocate
nothing; no multicast object is created. A reading that fails lands in ``errors`` and the rest
still comes back.

Exit codes: 0 the host JSON is on stdout; 3 NVML is unavailable (JSON ``{"error": ...}``);
anything else is a failure of this program.

``--replay FILE`` prints a recorded or modelled host instead (the simulated hardware), playing
back ``simulate.nvml = "missing"`` and ``simulate.native_probe = "crash" | "hang"``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import fiar_contract as contract
from node_agent import __version__

EXIT_NVML_UNAVAILABLE = 3

# CUdevice_attribute ids (CUDA 13.0 include/cuda.h)
CUDA_ATTRIBUTES = {
    "MULTICAST_SUPPORTED": 132,
    "HANDLE_TYPE_FABRIC_SUPPORTED": 128,
    "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED": 103,
    "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": 102,
    "COMPUTE_CAPABILITY_MAJOR": 75,
    "COMPUTE_CAPABILITY_MINOR": 76,
}
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
P2P_INDEXES = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
"""Literal ints: pynvml's ``NVML_P2P_CAPS_INDEX_READ = 0,`` is a tuple (trailing comma)."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_key(bus_id: str) -> tuple[int, str]:
    """NVML's ``00000000:00:06.0`` and CUDA's ``0000:00:06.0`` name the same device."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return int(domain, 16), rest
    except ValueError:
        return -1, bus_id.lower()


def _cuda_readings(errors: list[str]) -> tuple[dict[tuple[int, str], dict[str, int]], int | None, bool | None]:
    """Attributes per PCI bus id, the driver's CUDA version, whether cuMulticastCreate is exported."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        errors.append(f"libcuda: {exc}")
        return {}, None, None
    exported = hasattr(lib, "cuMulticastCreate")
    rc = lib.cuInit(0)
    if rc != 0:
        errors.append(f"cuInit returned {rc}")
        return {}, None, exported
    version = ctypes.c_int()
    driver_version = version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        errors.append("cuDeviceGetCount failed")
        return {}, driver_version, exported
    by_bus: dict[tuple[int, str], dict[str, int]] = {}
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            errors.append(f"cuDeviceGet({ordinal}) failed")
            continue
        bus = ctypes.create_string_buffer(64)
        if lib.cuDeviceGetPCIBusId(bus, 64, dev) != 0:
            errors.append(f"cuDeviceGetPCIBusId({ordinal}) failed")
            continue
        attrs: dict[str, int] = {}
        for name, attr in CUDA_ATTRIBUTES.items():
            value = ctypes.c_int()
            rc = lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev)
            if rc == 0:
                attrs[name] = value.value
            else:
                errors.append(f"cuDeviceGetAttribute({name}) on device {ordinal} returned {rc}")
        by_bus[_bus_key(bus.value.decode())] = attrs
    return by_bus, driver_version, exported


def read_host() -> dict[str, Any]:
    """Read this host. Raises ``RuntimeError('nvml: ...')`` if NVML does not initialise."""
    try:
        import pynvml as nv
    except ImportError as exc:
        raise RuntimeError(f"nvml: nvidia-ml-py is not installed ({exc})") from exc
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise RuntimeError(f"nvml: {exc}") from exc

    errors: list[str] = []

    def attempt(what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            errors.append(f"{what}: {exc}")
            return None

    doc: dict[str, Any] = {
        "host": None,
        "recorded_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recorded_by": f"fiar-agent {__version__}",
        "env": {k: os.environ[k] for k in contract.HOST_POLICY_ENV if k in os.environ},
        "nvml_version": _text(attempt("nvmlSystemGetNVMLVersion", nv.nvmlSystemGetNVMLVersion)),
        "driver_version": _text(attempt("nvmlSystemGetDriverVersion", nv.nvmlSystemGetDriverVersion)),
        "cuda_driver_version": attempt("nvmlSystemGetCudaDriverVersion_v2", nv.nvmlSystemGetCudaDriverVersion_v2),
    }
    count = attempt("nvmlDeviceGetCount", nv.nvmlDeviceGetCount) or 0
    handles = []
    gpus: list[dict[str, Any]] = []
    for i in range(count):
        h = attempt(f"nvmlDeviceGetHandleByIndex({i})", nv.nvmlDeviceGetHandleByIndex, i)
        handles.append(h)
        if h is None:
            continue
        mem = attempt(f"gpu {i} memory", nv.nvmlDeviceGetMemoryInfo, h)
        cc = attempt(f"gpu {i} compute capability", nv.nvmlDeviceGetCudaComputeCapability, h)
        pci = attempt(f"gpu {i} pci", nv.nvmlDeviceGetPciInfo, h)
        links = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                active = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    break  # no (more) links on this GPU
                errors.append(f"gpu {i} nvlink {link} state: {exc}")
                continue
            entry: dict[str, Any] = {"link": link, "active": int(active), "remote_type": None, "version": None}
            if active:
                with contextlib.suppress(nv.NVMLError):
                    entry["remote_type"] = int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
                with contextlib.suppress(nv.NVMLError):
                    entry["version"] = int(nv.nvmlDeviceGetNvLinkVersion(h, link))
            links.append(entry)
        fabric = None
        if hasattr(nv, "c_nvmlGpuFabricInfoV_t"):
            info = nv.c_nvmlGpuFabricInfoV_t()
            try:
                nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))  # by value segfaults
                fabric = {
                    "state": int(info.state),
                    "status": int(info.status),
                    "cliqueId": int(info.cliqueId),
                    "clusterUuid": bytes(info.clusterUuid).hex(),
                    "healthMask": int(info.healthMask),
                }
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != NVML_ERROR_NOT_SUPPORTED:
                    errors.append(f"gpu {i} fabric info: {exc}")
        procs = attempt(f"gpu {i} compute processes", nv.nvmlDeviceGetComputeRunningProcesses, h)
        gpus.append(
            {
                "index": i,
                "name": _text(attempt(f"gpu {i} name", nv.nvmlDeviceGetName, h)),
                "uuid": _text(attempt(f"gpu {i} uuid", nv.nvmlDeviceGetUUID, h)),
                "pci_bus_id": _text(pci.busId) if pci is not None else "",
                "memory_total_mib": int(mem.total // (1024 * 1024)) if mem is not None else None,
                "cc": [int(cc[0]), int(cc[1])] if cc else None,
                "nvlinks": links,
                "fabric_v2": fabric,
                "compute_processes": len(procs) if procs is not None else 0,
            }
        )
    p2p: dict[str, dict[str, Any]] = {}
    for a, ha in enumerate(handles):
        for b, hb in enumerate(handles):
            if a == b or ha is None or hb is None:
                continue
            entry = {
                cap: attempt(f"p2p {a}->{b} {cap}", nv.nvmlDeviceGetP2PStatus, ha, hb, idx)
                for cap, idx in P2P_INDEXES.items()
            }
            entry["common_ancestor"] = attempt(f"topology {a}->{b}", nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
            p2p[f"{a}->{b}"] = entry
    by_bus, cuda_version, exported = _cuda_readings(errors)
    attributes: list[dict[str, int] | None] = []
    for gpu in gpus:
        attrs = by_bus.get(_bus_key(gpu["pci_bus_id"]))
        if attrs is None and gpus:
            errors.append(f"gpu {gpu['index']}: not visible to the CUDA driver")
        attributes.append(attrs)
    if doc["cuda_driver_version"] is None:
        doc["cuda_driver_version"] = cuda_version
    doc.update(
        {
            "multicast_create_exported": exported,
            "gpus": gpus,
            "p2p": p2p,
            "cuda_attributes": attributes,
            "errors": errors,
        }
    )
    names = sorted({g["name"] for g in gpus})
    doc["host"] = f"{len(gpus)}x {', '.join(names)}" if gpus else "no GPUs"
    with contextlib.suppress(Exception):
        nv.nvmlShutdown()
    return doc


def read_driver_version() -> str:
    try:
        import pynvml as nv

        nv.nvmlInit()
        return _text(nv.nvmlSystemGetDriverVersion())
    except Exception as exc:
        raise RuntimeError(f"nvml: {exc}") from exc


def replay(path: Path, driver_only: bool) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    sim = doc.get("simulate") or {}
    mode = sim.get("native_probe", "ok")
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "hang":
        while True:
            time.sleep(60)
    if sim.get("nvml") == "missing":
        raise RuntimeError("nvml: NVML Shared Library Not Found (simulated host without a driver)")
    if driver_only:
        return {"driver_version": doc.get("driver_version")}
    return {k: v for k, v in doc.items() if k != "simulate"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node_agent.native_probe")
    parser.add_argument("--replay", type=Path, help="print a recorded/modelled host instead of reading this one")
    parser.add_argument("--driver-only", action="store_true", help="print only the driver version")
    args = parser.parse_args(argv)
    try:
        if args.replay is not None:
            doc = replay(args.replay, args.driver_only)
        elif args.driver_only:
            doc = {"driver_version": read_driver_version()}
        else:
            doc = read_host()
    except RuntimeError as exc:
        if str(exc).startswith("nvml:"):
            print(json.dumps({"error": str(exc)}))
            return EXIT_NVML_UNAVAILABLE
        raise
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
