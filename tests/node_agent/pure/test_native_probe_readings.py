"""The native probe's readings, each on its own, and the whole host read back from a fake driver.

``FakeNvml`` and ``FakeLibcuda`` are real fakes of the two native interfaces the probe calls: a
pynvml-shaped module and a ``ctypes.CDLL("libcuda.so.1")``-shaped library, both answering from a
recorded host document. ``FakeLibcuda`` takes the same ``ctypes`` arguments as the real library
(``byref`` pointers, string buffers, ``c_int`` devices) and writes through them, so the probe's
ctypes code runs unchanged. Any call named in ``failing`` raises (NVML) or returns an error code
(CUDA), which is how a broken driver looks to the probe.
"""

from __future__ import annotations

import copy
import ctypes
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from node_agent import hardware, inventory, native_probe
from node_agent.native_probe import GPU_READINGS, HOST_READINGS, Device, Devices, Host, Reading

SHARED_FIXTURES = Path("/work/shared/fixtures")
NOT_SUPPORTED = native_probe.NVML_ERROR_NOT_SUPPORTED
UNKNOWN_ERROR = 999


def fixture_paths() -> list[Path]:
    paths = sorted(hardware.FIXTURES.glob("*.json"))
    paths += sorted(p for p in SHARED_FIXTURES.glob("*-host.json") if p.is_file())
    return paths


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NOT_SUPPORTED: "Not Supported", UNKNOWN_ERROR: "Unknown Error"}.get(self.value, f"error {self.value}")


class FabricInfo(ctypes.Structure):
    """Stands for ``pynvml.c_nvmlGpuFabricInfoV_t``: the probe passes it by reference."""

    _fields_ = [
        ("state", ctypes.c_uint),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("healthMask", ctypes.c_uint),
    ]


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class Obj:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


class FakeNvml:
    """A pynvml-shaped module answering from a recorded host document."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    c_nvmlGpuFabricInfoV_t = FabricInfo

    def __init__(self, doc: Mapping[str, Any], failing: Iterable[str] = ()) -> None:
        self.doc = doc
        self.gpus: list[dict[str, Any]] = list(doc.get("gpus", []))
        self.failing = set(failing)
        self.shut_down = False

    def _check(self, call: str) -> None:
        if call in self.failing:
            raise NVMLError(UNKNOWN_ERROR)

    def _gpu(self, handle: Handle) -> dict[str, Any]:
        return self.gpus[handle.index]

    def nvmlInit(self) -> None:
        self._check("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check("nvmlSystemGetNVMLVersion")
        return str(self.doc.get("nvml_version"))

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return str(self.doc.get("driver_version"))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int | None:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        value = self.doc.get("cuda_driver_version")
        return None if value is None else int(value)

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        self._check(f"nvmlDeviceGetHandleByIndex({index})")
        return Handle(index)

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Obj:
        self._check("nvmlDeviceGetMemoryInfo")
        mib = self._gpu(h).get("memory_total_mib")
        return Obj(total=(mib or 0) * 1024 * 1024 + 4095)

    def nvmlDeviceGetCudaComputeCapability(self, h: Handle) -> tuple[int, int] | None:
        self._check("nvmlDeviceGetCudaComputeCapability")
        cc = self._gpu(h).get("cc")
        return None if cc is None else (cc[0], cc[1])

    def nvmlDeviceGetPciInfo(self, h: Handle) -> Obj:
        self._check("nvmlDeviceGetPciInfo")
        return Obj(busId=str(self._gpu(h).get("pci_bus_id", "")).encode())

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState")
        links = self._gpu(h).get("nvlinks") or []
        if link >= len(links):
            raise NVMLError(NOT_SUPPORTED)
        return int(links[link]["active"])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Handle, link: int) -> int:
        value = self._gpu(h)["nvlinks"][link].get("remote_type")
        if value is None or "nvmlDeviceGetNvLinkRemoteDeviceType" in self.failing:
            raise NVMLError(NOT_SUPPORTED)
        return int(value)

    def nvmlDeviceGetNvLinkVersion(self, h: Handle, link: int) -> int:
        value = self._gpu(h)["nvlinks"][link].get("version")
        if value is None or "nvmlDeviceGetNvLinkVersion" in self.failing:
            raise NVMLError(NOT_SUPPORTED)
        return int(value)

    def nvmlDeviceGetGpuFabricInfoV(self, h: Handle, ref: Any) -> None:
        self._check("nvmlDeviceGetGpuFabricInfoV")
        fabric = self._gpu(h).get("fabric_v2", self._gpu(h).get("fabric_v3"))
        if fabric is None:
            raise NVMLError(NOT_SUPPORTED)
        info = ref._obj  # a ctypes.byref() pointer keeps its object: the struct is filled in place
        info.state = fabric["state"]
        info.status = fabric.get("status", 0)
        info.cliqueId = fabric.get("cliqueId", 0)
        uuid = bytes.fromhex(fabric.get("clusterUuid", "0" * 32).replace("-", ""))
        info.clusterUuid = (ctypes.c_ubyte * 16).from_buffer_copy(uuid)
        info.healthMask = fabric.get("healthMask", 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Obj]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        return [Obj(pid=p) for p in range(self._gpu(h).get("compute_processes", 0))]

    def nvmlDeviceGetName(self, h: Handle) -> str:
        self._check("nvmlDeviceGetName")
        return str(self._gpu(h).get("name"))

    def nvmlDeviceGetUUID(self, h: Handle) -> bytes:
        self._check("nvmlDeviceGetUUID")
        return str(self._gpu(h).get("uuid")).encode()

    def _pair(self, a: Handle, b: Handle) -> dict[str, Any]:
        entry: dict[str, Any] = (self.doc.get("p2p") or {}).get(f"{a.index}->{b.index}") or {}
        return entry

    def nvmlDeviceGetP2PStatus(self, a: Handle, b: Handle, index: int) -> int:
        self._check("nvmlDeviceGetP2PStatus")
        value = self._pair(a, b).get(inventory.P2P_CAPS[index])
        if value is None:
            raise NVMLError(NOT_SUPPORTED)
        return int(value)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor")
        value = self._pair(a, b).get("common_ancestor")
        if value is None:
            raise NVMLError(NOT_SUPPORTED)
        return int(value)


class FakeLibcuda:
    """A ``ctypes.CDLL("libcuda.so.1")``-shaped library answering from a recorded host document."""

    def __init__(self, doc: Mapping[str, Any], failing: Iterable[str] = ()) -> None:
        self.doc = doc
        self.failing = set(failing)
        gpus = list(doc.get("gpus", []))
        attrs = list(doc.get("cuda_attributes") or [])
        # CUDA's own order and bus-id spelling differ from NVML's: the probe matches by bus id
        self.devices = [
            (_cuda_bus_id(str(g.get("pci_bus_id", ""))), _with_cc(attrs[i] if i < len(attrs) else None, g.get("cc")))
            for i, g in reversed(list(enumerate(gpus)))
        ]
        if doc.get("multicast_create_exported"):
            self.cuMulticastCreate = lambda *args: 0

    def _rc(self, call: str) -> int:
        return 1 if call in self.failing else 0

    def cuInit(self, flags: int) -> int:
        return 100 if "cuInit" in self.failing else 0

    def cuDriverGetVersion(self, ref: Any) -> int:
        value = self.doc.get("cuda_driver_version")
        if value is None or self._rc("cuDriverGetVersion"):
            return 1
        ref._obj.value = int(value)
        return 0

    def cuDeviceGetCount(self, ref: Any) -> int:
        ref._obj.value = len(self.devices)
        return self._rc("cuDeviceGetCount")

    def cuDeviceGet(self, ref: Any, ordinal: int) -> int:
        ref._obj.value = ordinal
        return self._rc("cuDeviceGet")

    def cuDeviceGetPCIBusId(self, buf: Any, size: int, dev: ctypes.c_int) -> int:
        buf.value = self.devices[dev.value][0].encode()[: size - 1]
        return self._rc("cuDeviceGetPCIBusId")

    def cuDeviceGetAttribute(self, ref: Any, attr: int, dev: ctypes.c_int) -> int:
        names = {v: k for k, v in native_probe.CUDA_ATTRIBUTES.items()}
        values = self.devices[dev.value][1] or {}
        value = values.get(names[attr])
        if value is None or "cuDeviceGetAttribute" in self.failing:
            return 1  # CUDA_ERROR_INVALID_VALUE
        ref._obj.value = int(value)
        return 0


def _with_cc(attrs: Mapping[str, Any] | None, cc: Any) -> dict[str, Any] | None:
    """A modelled host may leave the compute capability out of its attributes; a driver always has it."""
    if attrs is None:
        return None
    found = dict(attrs)
    if cc is not None:
        found.setdefault("COMPUTE_CAPABILITY_MAJOR", cc[0])
        found.setdefault("COMPUTE_CAPABILITY_MINOR", cc[1])
    return found


def _cuda_bus_id(nvml_bus_id: str) -> str:
    """NVML writes ``00000000:00:06.0``, CUDA ``0000:00:06.0``."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".upper() if rest else nvml_bus_id


def read(doc: Mapping[str, Any], nvml_failing: Iterable[str] = (), cuda_failing: Iterable[str] = ()) -> dict[str, Any]:
    nv = FakeNvml(doc, nvml_failing)
    lib = FakeLibcuda(doc, cuda_failing)
    return native_probe.read_host(nv, lambda: lib)


def hardware_of(doc: Mapping[str, Any]) -> inventory.Inventory:
    """The parsed host without what is not read from the hardware (environment, name, errors)."""
    inv = inventory.from_dict({k: v for k, v in doc.items() if k not in ("env", "host", "errors")})
    return inv


# -- the whole host --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", fixture_paths(), ids=lambda p: p.stem)
def test_the_probe_reads_back_every_recorded_host(path: Path) -> None:
    recorded = load(path)
    if recorded.get("multicast_create_exported") is None:
        recorded["multicast_create_exported"] = False  # what the probe writes when libcuda lacks it
    doc = read(recorded)
    assert doc["errors"] == []
    assert hardware_of(doc) == hardware_of(recorded)
    assert doc["host"].startswith(f"{len(recorded['gpus'])}x ")
    assert inventory.from_dict(doc).fingerprint() == inventory.from_dict(recorded).fingerprint()


def test_the_host_document_keeps_its_recorded_key_order() -> None:
    doc = read(load(hardware.FIXTURES / "h200x2-device.json"))
    assert list(doc) == [
        "host", "recorded_at", "recorded_by", "env", "nvml_version", "driver_version", "cuda_driver_version",
        "multicast_create_exported", "gpus", "p2p", "cuda_attributes", "errors",
    ]  # fmt: skip
    assert list(doc["gpus"][0]) == [
        "index", "name", "uuid", "pci_bus_id", "memory_total_mib", "cc", "nvlinks", "fabric_v2",
        "compute_processes",
    ]  # fmt: skip


def test_nvml_is_shut_down_after_reading() -> None:
    nv = FakeNvml(load(hardware.FIXTURES / "h200x2-device.json"))
    native_probe.read_host(nv, lambda: FakeLibcuda(nv.doc))
    assert nv.shut_down


def test_nvml_that_does_not_initialise_is_an_nvml_error() -> None:
    nv = FakeNvml(load(hardware.FIXTURES / "h200x2-device.json"), failing=["nvmlInit"])
    with pytest.raises(RuntimeError, match=r"^nvml: Unknown Error$"):
        native_probe.read_host(nv, lambda: FakeLibcuda(nv.doc))


@pytest.mark.parametrize(
    ("failing", "error"),
    [
        ("nvmlDeviceGetMemoryInfo", "gpu 0 memory: Unknown Error"),
        ("nvmlDeviceGetCudaComputeCapability", "gpu 0 compute capability: Unknown Error"),
        ("nvmlDeviceGetPciInfo", "gpu 0 pci: Unknown Error"),
        ("nvmlDeviceGetNvLinkState", "gpu 0 nvlink 0 state: Unknown Error"),
        ("nvmlDeviceGetGpuFabricInfoV", "gpu 0 fabric info: Unknown Error"),
        ("nvmlDeviceGetComputeRunningProcesses", "gpu 0 compute processes: Unknown Error"),
        ("nvmlDeviceGetUUID", "gpu 1 uuid: Unknown Error"),
        ("nvmlDeviceGetP2PStatus", "p2p 0->1 read: Unknown Error"),
        ("nvmlDeviceGetTopologyCommonAncestor", "topology 0->1: Unknown Error"),
        ("nvmlDeviceGetHandleByIndex(1)", "nvmlDeviceGetHandleByIndex(1): Unknown Error"),
        ("nvmlSystemGetDriverVersion", "nvmlSystemGetDriverVersion: Unknown Error"),
    ],
)
def test_a_failed_nvml_reading_is_an_error_and_the_rest_comes_back(failing: str, error: str) -> None:
    recorded = load(hardware.FIXTURES / "h200x2-device.json")
    doc = read(recorded, nvml_failing=[failing])
    assert error in doc["errors"]
    assert doc["multicast_create_exported"] is True, "the CUDA readings still came back"
    assert doc["nvml_version"] == recorded["nvml_version"], "so did the other readings"
    assert doc["gpus"][0]["index"] == 0


def test_a_gpu_the_cuda_driver_does_not_show_is_named() -> None:
    recorded = load(hardware.FIXTURES / "h200x2-device.json")
    lib = FakeLibcuda(recorded)
    lib.devices = lib.devices[:1]  # CUDA sees GPU 1 only (its order is reversed)
    doc = native_probe.read_host(FakeNvml(recorded), lambda: lib)
    assert doc["errors"] == ["gpu 0: not visible to the CUDA driver"]
    assert doc["cuda_attributes"][0] is None
    assert doc["cuda_attributes"][1] == recorded["cuda_attributes"][1]


def test_without_libcuda_the_nvml_readings_still_come_back() -> None:
    recorded = load(hardware.FIXTURES / "h200x2-device.json")

    def missing() -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file")

    doc = native_probe.read_host(FakeNvml(recorded), missing)
    assert doc["errors"][0] == "libcuda: libcuda.so.1: cannot open shared object file"
    assert doc["multicast_create_exported"] is None
    assert doc["cuda_attributes"] == [None, None]
    assert len(doc["gpus"]) == 2 and doc["p2p"]


def test_cuda_driver_version_comes_from_libcuda_when_nvml_cannot_say() -> None:
    recorded = load(hardware.FIXTURES / "h200x2-device.json")
    doc = read(recorded, nvml_failing=["nvmlSystemGetCudaDriverVersion_v2"])
    assert doc["cuda_driver_version"] == recorded["cuda_driver_version"]


def test_a_cuda_init_failure_is_an_error_and_the_export_is_still_known() -> None:
    doc = read(load(hardware.FIXTURES / "h200x2-device.json"), cuda_failing=["cuInit"])
    assert "cuInit returned 100" in doc["errors"]
    assert doc["multicast_create_exported"] is True


# -- one reading at a time -------------------------------------------------------------------------


def _device(doc: Mapping[str, Any], index: int = 0, failing: Iterable[str] = ()) -> tuple[FakeNvml, Device]:
    nv = FakeNvml(doc, failing)
    return nv, Device(index, Handle(index))


def test_nvlinks_stop_at_the_first_link_the_gpu_does_not_have() -> None:
    doc = copy.deepcopy(load(hardware.FIXTURES / "h200x2-device.json"))
    doc["gpus"][0]["nvlinks"] = doc["gpus"][0]["nvlinks"][:3]
    nv, gpu = _device(doc)
    reading = native_probe.nvlinks(nv, gpu)
    assert reading.errors == ()
    assert [link["link"] for link in reading.values["nvlinks"]] == [0, 1, 2]


def test_an_inactive_link_has_no_remote_type_or_version() -> None:
    doc = copy.deepcopy(load(hardware.FIXTURES / "h200x2-device.json"))
    doc["gpus"][0]["nvlinks"] = [{"link": 0, "active": 0, "remote_type": 2, "version": 6}]
    nv, gpu = _device(doc)
    assert native_probe.nvlinks(nv, gpu).values["nvlinks"] == [
        {"link": 0, "active": 0, "remote_type": None, "version": None}
    ]


def test_a_gpu_without_fabric_reads_none_without_an_error() -> None:
    doc = copy.deepcopy(load(hardware.FIXTURES / "h100x4-pcie-no-nvlink.json"))
    doc["gpus"][0]["fabric_v2"] = None
    nv, gpu = _device(doc)
    assert native_probe.fabric(nv, gpu) == Reading({"fabric_v2": None})


def test_fabric_info_is_read_into_a_struct_passed_by_reference() -> None:
    nv, gpu = _device(load(hardware.FIXTURES / "gb200-nvl72-clique.json"))
    fabric = native_probe.fabric(nv, gpu).values["fabric_v2"]
    assert fabric["state"] == inventory.FABRIC_STATE_COMPLETED
    assert fabric["clusterUuid"] == "6f1c2b8e4d3a4f0e9b7c5a1d2e3f4a5b"


def test_memory_is_whole_mebibytes() -> None:
    nv, gpu = _device(load(hardware.FIXTURES / "h200x2-device.json"))
    mib = load(hardware.FIXTURES / "h200x2-device.json")["gpus"][0]["memory_total_mib"]
    assert native_probe.memory(nv, gpu) == Reading({"memory_total_mib": mib})


def test_an_unreadable_compute_capability_is_none_and_an_error() -> None:
    nv, gpu = _device(load(hardware.FIXTURES / "h200x2-device.json"), failing=["nvmlDeviceGetCudaComputeCapability"])
    assert native_probe.compute_capability(nv, gpu) == Reading(
        {"cc": None}, ("gpu 0 compute capability: Unknown Error",)
    )


def test_unreadable_compute_processes_count_as_none_running() -> None:
    nv, gpu = _device(load(hardware.FIXTURES / "h200x2-device.json"), failing=["nvmlDeviceGetComputeRunningProcesses"])
    assert native_probe.compute_processes(nv, gpu).values == {"compute_processes": 0}


def test_p2p_is_read_for_every_ordered_pair_of_readable_gpus() -> None:
    doc = load(hardware.FIXTURES / "h100x8-nvswitch-healthy.json")
    nv = FakeNvml(doc)
    devices = Devices(tuple(Handle(i) for i in range(8)), tuple(() for _ in range(8)))
    host = Host(nv, devices, lambda: FakeLibcuda(doc))
    p2p = native_probe.p2p(host, {}).values["p2p"]
    assert len(p2p) == 8 * 7
    assert p2p["3->5"] == doc["p2p"]["3->5"]


def test_p2p_skips_a_gpu_without_a_handle() -> None:
    doc = load(hardware.FIXTURES / "h100x4-pcie-no-nvlink.json")
    devices = Devices((Handle(0), None, Handle(2)), ((), ("lost",), ()))
    host = Host(FakeNvml(doc), devices, lambda: FakeLibcuda(doc))
    assert sorted(native_probe.p2p(host, {}).values["p2p"]) == ["0->2", "2->0"]


def test_the_host_is_named_after_its_gpus() -> None:
    gpus = [{"name": "B"}, {"name": "A"}, {"name": "B"}]
    assert native_probe.host_name(Host(FakeNvml({}), Devices((), ()), lambda: None), {"gpus": gpus}).values == {
        "host": "3x A, B"
    }
    assert native_probe.host_name(Host(FakeNvml({}), Devices((), ()), lambda: None), {"gpus": []}).values == {
        "host": "no GPUs"
    }


def test_every_reading_is_registered_once() -> None:
    for table in (HOST_READINGS, GPU_READINGS):
        names = [name for name, _ in table]
        assert len(names) == len(set(names))


def test_a_new_reading_is_one_function_and_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    def board_serial(nv: Any, gpu: Device) -> Reading:
        return Reading({"serial": f"S{gpu.index}"}, (f"gpu {gpu.index} serial: made up",))

    def gpu_count(host: Host, doc: Mapping[str, Any]) -> Reading:
        return Reading({"gpu_count": len(doc["gpus"])})

    monkeypatch.setattr(native_probe, "GPU_READINGS", (*GPU_READINGS, ("serial", board_serial)))
    monkeypatch.setattr(native_probe, "HOST_READINGS", (*HOST_READINGS, ("gpu count", gpu_count)))
    doc = read(load(hardware.FIXTURES / "h200x2-device.json"))
    assert [g["serial"] for g in doc["gpus"]] == ["S0", "S1"]
    assert list(doc["gpus"][0])[-1] == "serial", "a new key follows the recorded ones"
    assert doc["gpu_count"] == 2
    assert doc["errors"] == ["gpu 0 serial: made up", "gpu 1 serial: made up"]
