"""Child process that reads NVML and the CUDA driver and prints the host in the recorded format.

Run as ``python -m node_agent.native_probe`` by ``node_agent.hardware``, never imported by the
resident agent for its side effects: NVML and libcuda calls can crash the calling process (passing
the fabric-info struct by value segfaults; it must go through ``ctypes.byref``), so they run here,
where a crash is an exit status the parent reports.

Everything is read-only. ``cuInit`` plus ``cuDeviceGetAttribute`` need no context and allocate
nothing; no multicast object is created. A reading that fails lands in ``errors`` and the rest
still comes back.

Each reading is one function returning a ``Reading`` (the keys it adds, and its errors), registered
in an ordered table: ``HOST_READINGS`` for the host document, ``GPU_READINGS`` for one GPU's entry.
``read_host`` folds the host table; the ``gpus`` reading folds the GPU table per GPU. A new reading
is one function and one line in its table; the loops do not change. A reading names the fields it
read (``schema.recorded``); their keys, spelling and order are those of ``node_agent.inventory``.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fiar_contract as contract
from node_agent import __version__, schema
from node_agent.inventory import GPU_KEYS, HOST_KEYS, P2P, CudaAttributes, Fabric, Gpu, Inventory, NvLink

EXIT_NVML_UNAVAILABLE = 3

CUDA_ATTRIBUTES = {
    **{f.key.name: f.key.native for f in schema.fields(CudaAttributes) if f.key.native is not None},
    "COMPUTE_CAPABILITY_MAJOR": 75,
    "COMPUTE_CAPABILITY_MINOR": 76,
}
"""``CUdevice_attribute`` ids read per device: those of ``CudaAttributes``, and the compute
capability (recorded, not parsed)."""
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
P2P_FIELDS = tuple(f for f in schema.fields(P2P) if f.key.native is not None)
"""The P2P capabilities read per pair, with their ``nvmlGpuP2PCapsIndex_t`` (literal ints: pynvml's
``NVML_P2P_CAPS_INDEX_READ = 0,`` is a tuple, trailing comma)."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_key(bus_id: str) -> tuple[int, str]:
    """NVML's ``00000000:00:06.0`` and CUDA's ``0000:00:06.0`` name the same device."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return int(domain, 16), rest
    except ValueError:
        return -1, bus_id.lower()


@dataclass(frozen=True)
class Reading:
    """What one reading adds to the host document (or to one GPU's entry), and the errors met on the
    way. A reading that fails returns its "unknown" value and the error: the rest still comes back."""

    values: Mapping[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


def _attempt(what: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, tuple[str, ...]]:
    """``fn(*args)``, or None and the error named after ``what``."""
    try:
        return fn(*args), ()
    except Exception as exc:
        return None, (f"{what}: {exc}",)


@dataclass(frozen=True)
class Device:
    """One GPU as NVML numbers it, with the handle every per-GPU reading uses."""

    index: int
    handle: Any


@dataclass(frozen=True)
class Devices:
    """NVML's handles in index order (None where the lookup failed) and the errors of each lookup."""

    handles: tuple[Any, ...]
    errors: tuple[tuple[str, ...], ...]
    count_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Host:
    """What the host readings read from: NVML (the pynvml module), its devices, and a loader of libcuda."""

    nv: Any
    devices: Devices
    load_libcuda: Callable[[], Any]


GpuReading = Callable[[Any, Device], Reading]
"""One reading of one GPU: ``(nv, device) -> Reading`` with keys of that GPU's entry."""
HostReading = Callable[[Host, Mapping[str, Any]], Reading]
"""One reading of the host: ``(host, document so far) -> Reading`` with keys of the host document."""


def open_devices(nv: Any) -> Devices:
    count, count_errors = _attempt("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
    lookups = [
        _attempt(f"nvmlDeviceGetHandleByIndex({i})", nv.nvmlDeviceGetHandleByIndex, i) for i in range(count or 0)
    ]
    return Devices(tuple(h for h, _ in lookups), tuple(e for _, e in lookups), count_errors)


# -- per-GPU readings (in the order they are read; the entry's keys follow inventory.GPU_KEYS) -----


def _gpu(errors: tuple[str, ...] = (), **fields: Any) -> Reading:
    return Reading(schema.recorded(Gpu, **fields), errors)


def memory(nv: Any, gpu: Device) -> Reading:
    mem, errors = _attempt(f"gpu {gpu.index} memory", nv.nvmlDeviceGetMemoryInfo, gpu.handle)
    return _gpu(errors, memory_total_mib=int(mem.total // (1024 * 1024)) if mem is not None else None)


def compute_capability(nv: Any, gpu: Device) -> Reading:
    cc, errors = _attempt(f"gpu {gpu.index} compute capability", nv.nvmlDeviceGetCudaComputeCapability, gpu.handle)
    return _gpu(errors, cc=(int(cc[0]), int(cc[1])) if cc else None)


def pci(nv: Any, gpu: Device) -> Reading:
    info, errors = _attempt(f"gpu {gpu.index} pci", nv.nvmlDeviceGetPciInfo, gpu.handle)
    return _gpu(errors, pci_bus_id=_text(info.busId) if info is not None else "")


def nvlinks(nv: Any, gpu: Device) -> Reading:
    """Every link up to the first the GPU does not have; remote type and version of active ones."""
    links: list[NvLink] = []
    errors: list[str] = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active = nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                break  # no (more) links on this GPU
            errors.append(f"gpu {gpu.index} nvlink {link} state: {exc}")
            continue
        remote_type = version = None
        if active:
            with contextlib.suppress(nv.NVMLError):
                remote_type = int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(gpu.handle, link))
            with contextlib.suppress(nv.NVMLError):
                version = int(nv.nvmlDeviceGetNvLinkVersion(gpu.handle, link))
        links.append(NvLink(link, bool(active), remote_type, version))
    return _gpu(tuple(errors), nvlinks=tuple(links))


def fabric(nv: Any, gpu: Device) -> Reading:
    """``nvmlGpuFabricInfo`` v2; None where NVML has no such call or the GPU no fabric."""
    if not hasattr(nv, "c_nvmlGpuFabricInfoV_t"):
        return _gpu(fabric=None)
    info = nv.c_nvmlGpuFabricInfoV_t()
    try:
        nv.nvmlDeviceGetGpuFabricInfoV(gpu.handle, ctypes.byref(info))  # by value segfaults
    except nv.NVMLError as exc:
        if getattr(exc, "value", None) != NVML_ERROR_NOT_SUPPORTED:
            return _gpu((f"gpu {gpu.index} fabric info: {exc}",), fabric=None)
        return _gpu(fabric=None)
    found = Fabric(
        state=int(info.state),
        status=int(info.status),
        clique_id=int(info.cliqueId),
        cluster_uuid=bytes(info.clusterUuid).hex(),
        health_mask=int(info.healthMask),
    )
    return _gpu(fabric=found)


def compute_processes(nv: Any, gpu: Device) -> Reading:
    procs, errors = _attempt(f"gpu {gpu.index} compute processes", nv.nvmlDeviceGetComputeRunningProcesses, gpu.handle)
    return _gpu(errors, compute_processes=len(procs) if procs is not None else 0)


def name(nv: Any, gpu: Device) -> Reading:
    value, errors = _attempt(f"gpu {gpu.index} name", nv.nvmlDeviceGetName, gpu.handle)
    return _gpu(errors, name=_text(value))


def uuid(nv: Any, gpu: Device) -> Reading:
    value, errors = _attempt(f"gpu {gpu.index} uuid", nv.nvmlDeviceGetUUID, gpu.handle)
    return _gpu(errors, uuid=_text(value))


GPU_READINGS: tuple[tuple[str, GpuReading], ...] = (
    ("memory", memory),
    ("compute capability", compute_capability),
    ("pci", pci),
    ("nvlinks", nvlinks),
    ("fabric", fabric),
    ("compute processes", compute_processes),
    ("name", name),
    ("uuid", uuid),
)
"""Every reading of one GPU, in the order they are taken. A new one is a function and a line here."""


def read_gpu(nv: Any, gpu: Device) -> Reading:
    """One GPU's entry: the fold of ``GPU_READINGS``."""
    entry = schema.recorded(Gpu, index=gpu.index)
    errors: list[str] = []
    for _name, reading in GPU_READINGS:
        piece = reading(nv, gpu)
        entry.update(piece.values)
        errors.extend(piece.errors)
    return Reading(schema.in_order(entry, GPU_KEYS), tuple(errors))


# -- host readings (in the order they are read; the document's keys follow inventory.HOST_KEYS) -----


def provenance(host: Host, doc: Mapping[str, Any]) -> Reading:
    """When and by what the host was read, and the host-policy variables the agent sees."""
    return Reading(
        {
            "recorded_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "recorded_by": f"fiar-agent {__version__}",
            **schema.recorded(
                Inventory, host_env={k: os.environ[k] for k in contract.HOST_POLICY_ENV if k in os.environ}
            ),
        }
    )


def system_versions(host: Host, doc: Mapping[str, Any]) -> Reading:
    nv = host.nv
    nvml, e1 = _attempt("nvmlSystemGetNVMLVersion", nv.nvmlSystemGetNVMLVersion)
    driver, e2 = _attempt("nvmlSystemGetDriverVersion", nv.nvmlSystemGetDriverVersion)
    cuda, e3 = _attempt("nvmlSystemGetCudaDriverVersion_v2", nv.nvmlSystemGetCudaDriverVersion_v2)
    values = schema.recorded(
        Inventory, nvml_version=_text(nvml), driver_version=_text(driver), cuda_driver_version=cuda
    )
    return Reading(values, e1 + e2 + e3)


def gpus(host: Host, doc: Mapping[str, Any]) -> Reading:
    """Every GPU with a handle (``read_gpu``); a failed lookup leaves that GPU out, with its error."""
    entries: list[dict[str, Any]] = []
    errors = list(host.devices.count_errors)
    for index, (handle, lookup_errors) in enumerate(zip(host.devices.handles, host.devices.errors, strict=True)):
        errors.extend(lookup_errors)
        if handle is None:
            continue
        piece = read_gpu(host.nv, Device(index, handle))
        entries.append(dict(piece.values))
        errors.extend(piece.errors)
    return Reading({"gpus": entries}, tuple(errors))


def p2p(host: Host, doc: Mapping[str, Any]) -> Reading:
    """P2P status per capability and the PCIe common ancestor, for every ordered pair of GPUs."""
    nv, handles = host.nv, host.devices.handles
    pairs: dict[tuple[int, int], P2P] = {}
    errors: list[str] = []
    for a, ha in enumerate(handles):
        for b, hb in enumerate(handles):
            if a == b or ha is None or hb is None:
                continue
            status: dict[str, Any] = {}
            for cap in P2P_FIELDS:
                what = f"p2p {a}->{b} {cap.key.name}"
                status[cap.attr], e = _attempt(what, nv.nvmlDeviceGetP2PStatus, ha, hb, cap.key.native)
                errors.extend(e)
            ancestor, e = _attempt(f"topology {a}->{b}", nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
            errors.extend(e)
            pairs[(a, b)] = P2P(**status, common_ancestor=ancestor)
    return Reading(schema.recorded(Inventory, p2p=pairs), tuple(errors))


def cuda(host: Host, doc: Mapping[str, Any]) -> Reading:
    """CUDA driver attributes per GPU (matched by PCI bus id), whether libcuda exports
    ``cuMulticastCreate``, and the CUDA driver version where NVML could not say."""
    found = read_cuda(host.load_libcuda)
    errors = list(found.errors)
    attributes: list[dict[str, int] | None] = []
    for gpu in doc.get("gpus", []):
        attrs = found.by_bus.get(_bus_key(gpu["pci_bus_id"]))
        if attrs is None:
            errors.append(f"gpu {gpu['index']}: not visible to the CUDA driver")
        attributes.append(attrs)
    values = schema.recorded(Inventory, multicast_create_exported=found.multicast_create_exported)
    if doc.get("cuda_driver_version") is None:
        values.update(schema.recorded(Inventory, cuda_driver_version=found.driver_version))
    values["cuda_attributes"] = attributes
    return Reading(values, tuple(errors))


def host_name(host: Host, doc: Mapping[str, Any]) -> Reading:
    """``<n>x <models>`` or ``no GPUs``."""
    entries = doc.get("gpus", [])
    names = sorted({g["name"] for g in entries})
    return Reading(schema.recorded(Inventory, host=f"{len(entries)}x {', '.join(names)}" if entries else "no GPUs"))


HOST_READINGS: tuple[tuple[str, HostReading], ...] = (
    ("provenance", provenance),
    ("system versions", system_versions),
    ("gpus", gpus),
    ("p2p", p2p),
    ("cuda", cuda),
    ("host name", host_name),
)
"""Every reading of the host, in the order they are taken; a later one sees what the earlier ones
read. A new one is a function and a line here."""


# -- the CUDA driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaReading:
    """What libcuda says, read without a context: attributes per PCI bus id, the driver's CUDA
    version, whether ``cuMulticastCreate`` is exported (None: libcuda could not be loaded)."""

    by_bus: Mapping[tuple[int, str], dict[str, int]] = field(default_factory=dict)
    driver_version: int | None = None
    multicast_create_exported: bool | None = None
    errors: tuple[str, ...] = ()


def _device_attributes(lib: Any, ordinal: int) -> tuple[tuple[tuple[int, str], dict[str, int]] | None, list[str]]:
    """One device's bus id and ``CUDA_ATTRIBUTES``, or None when the device cannot be named."""
    dev = ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None, [f"cuDeviceGet({ordinal}) failed"]
    bus = ctypes.create_string_buffer(64)
    if lib.cuDeviceGetPCIBusId(bus, 64, dev) != 0:
        return None, [f"cuDeviceGetPCIBusId({ordinal}) failed"]
    attrs: dict[str, int] = {}
    errors: list[str] = []
    for attr_name, attr in CUDA_ATTRIBUTES.items():
        value = ctypes.c_int()
        rc = lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev)
        if rc == 0:
            attrs[attr_name] = value.value
        else:
            errors.append(f"cuDeviceGetAttribute({attr_name}) on device {ordinal} returned {rc}")
    return (_bus_key(bus.value.decode()), attrs), errors


def read_cuda(load_libcuda: Callable[[], Any]) -> CudaReading:
    try:
        lib = load_libcuda()
    except OSError as exc:
        return CudaReading(errors=(f"libcuda: {exc}",))
    exported = hasattr(lib, "cuMulticastCreate")
    rc = lib.cuInit(0)
    if rc != 0:
        return CudaReading(multicast_create_exported=exported, errors=(f"cuInit returned {rc}",))
    version = ctypes.c_int()
    driver_version = version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return CudaReading({}, driver_version, exported, ("cuDeviceGetCount failed",))
    by_bus: dict[tuple[int, str], dict[str, int]] = {}
    errors: list[str] = []
    for ordinal in range(count.value):
        found, device_errors = _device_attributes(lib, ordinal)
        errors.extend(device_errors)
        if found is not None:
            by_bus[found[0]] = found[1]
    return CudaReading(by_bus, driver_version, exported, tuple(errors))


def _libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError(f"nvml: nvidia-ml-py is not installed ({exc})") from exc
    return pynvml


def read_host(nv: Any = None, load_libcuda: Callable[[], Any] = _libcuda) -> dict[str, Any]:
    """Read this host: the fold of ``HOST_READINGS``. ``nv`` is the pynvml module (imported when
    None). Raises ``RuntimeError('nvml: ...')`` if NVML does not initialise."""
    nv = _nvml() if nv is None else nv
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise RuntimeError(f"nvml: {exc}") from exc
    try:
        host = Host(nv, open_devices(nv), load_libcuda)
        doc: dict[str, Any] = {}
        errors: list[str] = []
        for _name, reading in HOST_READINGS:
            piece = reading(host, doc)
            doc.update(piece.values)
            errors.extend(piece.errors)
        doc.update(schema.recorded(Inventory, errors=tuple(errors)))
        return schema.in_order(doc, HOST_KEYS)
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


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
