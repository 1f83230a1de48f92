"""What the agent knows about a host's GPUs, and the JSON format hosts are recorded in.

The format is the one of ``node_agent/fixtures/h200x2-host.json`` (a real 2x H200 reading): the native
probe prints it, ``fiar-agent inventory`` writes it, and ``--simulate`` reads it back, so a
recorded host and a live one go through the same parser. Values keep NVML's and the CUDA driver's
own numbering (fabric state 3 = COMPLETED, NVLink remote type 2 = NVSwitch, P2P status 0 = OK).

Optional keys beyond the recorded format:

* ``multicast_create_exported``: whether libcuda exports ``cuMulticastCreate`` (driver >= 535).
* ``errors``: readings that failed while the rest succeeded.
* ``modelled``/``models``: the host is modelled after a public report, not recorded.
* ``simulate``: outcomes the simulated hardware plays back (see ``node_agent.hardware``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from node_agent.errors import FixtureError

FABRIC_STATE_COMPLETED = 3
"""``NVML_GPU_FABRIC_STATE_COMPLETED``."""
NVLINK_REMOTE_SWITCH = 2
"""``NVML_NVLINK_DEVICE_TYPE_SWITCH``."""
P2P_OK = 0
"""``NVML_P2P_STATUS_OK``."""
P2P_CAPS = ("read", "write", "nvlink", "atomics", "pci")
"""``nvmlGpuP2PCapsIndex_t`` names in index order (0..4)."""
COMM_KERNEL_GENERATIONS: Final[Mapping[int, str]] = MappingProxyType({9: "Hopper", 10: "Blackwell"})
"""SM major -> GPU generation, for the GPUs FlashInfer 0.6.13 builds its trtllm and mnnvl
allreduce-fusion comm kernels for (``flashinfer/jit/comm.py``; 0.7.2 adds SM 12 to trtllm only). On
any other GPU neither backend exists. The one place of this fact: the probe's applicability check
and the simulated hardware's model both read it."""


def has_comm_kernels(cc: tuple[int, int]) -> bool:
    """Whether FlashInfer builds its allreduce-fusion comm kernels for compute capability ``cc``."""
    return cc[0] in COMM_KERNEL_GENERATIONS


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    remote_type: int | None = None
    version: int | None = None


@dataclass(frozen=True)
class Fabric:
    """``nvmlGpuFabricInfo`` (v2) of one GPU."""

    state: int
    status: int
    clique_id: int
    cluster_uuid: str
    """32 lower-case hex digits; all zero on a single-node fabric."""
    health_mask: int = 0

    @property
    def completed(self) -> bool:
        return self.state == FABRIC_STATE_COMPLETED and self.status == 0

    @property
    def has_cluster(self) -> bool:
        return any(c != "0" for c in self.cluster_uuid)

    @property
    def clique(self) -> str:
        """``<clusterUUID>.<cliqueId>`` with the UUID in its dashed form."""
        u = self.cluster_uuid
        return f"{u[0:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:32]}.{self.clique_id}"


@dataclass(frozen=True)
class CudaAttributes:
    """CUDA driver device attributes, read without creating a context."""

    multicast_supported: int | None = None
    """``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` (132): necessary, not sufficient."""
    fabric_handles: int | None = None
    posix_fd_handles: int | None = None
    vmm: int | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str = ""
    memory_total_mib: int | None = None
    cc: tuple[int, int] | None = None
    nvlinks: tuple[NvLink, ...] = ()
    fabric: Fabric | None = None
    compute_processes: int = 0
    cuda: CudaAttributes | None = None

    @property
    def active_links(self) -> int:
        return sum(1 for link in self.nvlinks if link.active)

    @property
    def switch_links(self) -> int:
        return sum(1 for link in self.nvlinks if link.active and link.remote_type == NVLINK_REMOTE_SWITCH)

    @property
    def cc_str(self) -> str:
        return f"{self.cc[0]}.{self.cc[1]}" if self.cc else "unknown"


@dataclass(frozen=True)
class P2P:
    """``nvmlDeviceGetP2PStatus`` per capability (0 = OK) and the PCIe common ancestor level."""

    read: int | None = None
    write: int | None = None
    nvlink: int | None = None
    atomics: int | None = None
    pci: int | None = None
    common_ancestor: int | None = None


@dataclass(frozen=True)
class Inventory:
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: tuple[Gpu, ...]
    nvml_version: str | None = None
    p2p: Mapping[tuple[int, int], P2P] = field(default_factory=dict)
    multicast_create_exported: bool | None = None
    host_env: Mapping[str, str] = field(default_factory=dict)
    """The host-policy variables the host sets (only those; never the whole environment)."""
    host: str | None = None
    errors: tuple[str, ...] = ()

    @property
    def cuda_driver_str(self) -> str | None:
        v = self.cuda_driver_version
        return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"

    @property
    def compute_processes(self) -> int:
        return sum(g.compute_processes for g in self.gpus)

    def nvlink_p2p(self, a: int, b: int) -> bool | None:
        """Whether NVML reports NVLink P2P between GPUs ``a`` and ``b`` (both directions)."""
        states = [self.p2p.get((a, b)), self.p2p.get((b, a))]
        if any(s is None or s.nvlink is None for s in states):
            return None
        return all(s is not None and s.nvlink == P2P_OK for s in states)

    def any_p2p(self, a: int, b: int) -> bool | None:
        """Whether any P2P path (NVLink, or PCIe read+write) exists between ``a`` and ``b``."""
        nvlink = self.nvlink_p2p(a, b)
        if nvlink:
            return True
        states = [self.p2p.get((a, b)), self.p2p.get((b, a))]
        if any(s is None or s.read is None for s in states):
            return nvlink
        return all(s is not None and s.read == P2P_OK and s.write == P2P_OK for s in states)

    def fingerprint(self) -> str:
        """Identifies driver + GPU set: a verdict is only reused while this stays the same."""
        key = "|".join([self.driver_version or "", *sorted(g.uuid for g in self.gpus)])
        return hashlib.sha256(key.encode()).hexdigest()[:16]


# -- parsing ---------------------------------------------------------------------------------------


def short(value: Any) -> str:
    """A bounded repr of an untrusted value for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int(value: Any, where: str, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FixtureError(f"{where}: expected an integer, got {short(value)}")
    return value


def _req_int(value: Any, where: str) -> int:
    result = _int(value, where, optional=False)
    assert result is not None
    return result


def _str(value: Any, where: str, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise FixtureError(f"{where}: expected a string, got {short(value)}")
    return value


def _fabric(raw: Any, where: str) -> Fabric | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise FixtureError(f"{where}: expected an object")
    uuid = _str(raw.get("clusterUuid", "0" * 32), f"{where}.clusterUuid", optional=False) or ""
    uuid = uuid.replace("-", "").lower()
    if len(uuid) != 32 or any(c not in "0123456789abcdef" for c in uuid):
        raise FixtureError(f"{where}.clusterUuid: expected 32 hex digits, got {short(uuid)}")
    return Fabric(
        state=_req_int(raw.get("state"), f"{where}.state"),
        status=_req_int(raw.get("status", 0), f"{where}.status"),
        clique_id=_req_int(raw.get("cliqueId", 0), f"{where}.cliqueId"),
        cluster_uuid=uuid,
        health_mask=_req_int(raw.get("healthMask", 0), f"{where}.healthMask"),
    )


def _cuda_attributes(raw: Any, where: str) -> CudaAttributes | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise FixtureError(f"{where}: expected an object")
    return CudaAttributes(
        multicast_supported=_int(raw.get("MULTICAST_SUPPORTED"), f"{where}.MULTICAST_SUPPORTED"),
        fabric_handles=_int(raw.get("HANDLE_TYPE_FABRIC_SUPPORTED"), f"{where}.HANDLE_TYPE_FABRIC_SUPPORTED"),
        posix_fd_handles=_int(
            raw.get("HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"),
            f"{where}.HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
        ),
        vmm=_int(raw.get("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"), f"{where}.VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
    )


def _gpu(raw: Any, attrs: Any, where: str) -> Gpu:
    if not isinstance(raw, dict):
        raise FixtureError(f"{where}: expected an object")
    links = []
    links_raw = raw.get("nvlinks") or []
    if not isinstance(links_raw, list):
        raise FixtureError(f"{where}.nvlinks: expected a list, got {short(links_raw)}")
    for i, link in enumerate(links_raw):
        lw = f"{where}.nvlinks[{i}]"
        if not isinstance(link, dict):
            raise FixtureError(f"{lw}: expected an object")
        links.append(
            NvLink(
                link=_req_int(link.get("link", i), f"{lw}.link"),
                active=bool(_int(link.get("active", 0), f"{lw}.active")),
                remote_type=_int(link.get("remote_type"), f"{lw}.remote_type"),
                version=_int(link.get("version"), f"{lw}.version"),
            )
        )
    cc_raw = raw.get("cc")
    cc: tuple[int, int] | None = None
    if cc_raw is not None:
        if not (isinstance(cc_raw, list) and len(cc_raw) == 2 and all(isinstance(x, int) for x in cc_raw)):
            raise FixtureError(f"{where}.cc: expected [major, minor]")
        cc = (cc_raw[0], cc_raw[1])
    return Gpu(
        index=_req_int(raw.get("index"), f"{where}.index"),
        name=_str(raw.get("name", "unknown"), f"{where}.name", optional=False) or "unknown",
        uuid=_str(raw.get("uuid", ""), f"{where}.uuid", optional=False) or "",
        pci_bus_id=_str(raw.get("pci_bus_id", ""), f"{where}.pci_bus_id", optional=False) or "",
        memory_total_mib=_int(raw.get("memory_total_mib"), f"{where}.memory_total_mib"),
        cc=cc,
        nvlinks=tuple(links),
        fabric=_fabric(raw.get("fabric_v2", raw.get("fabric_v3")), f"{where}.fabric_v2"),
        compute_processes=_req_int(raw.get("compute_processes", 0), f"{where}.compute_processes"),
        cuda=_cuda_attributes(attrs, f"cuda_attributes[{raw.get('index')}]"),
    )


def from_dict(doc: Mapping[str, Any]) -> Inventory:
    """Parse the recorded-host format; raises ``FixtureError`` with the offending path."""
    if not isinstance(doc, Mapping):
        raise FixtureError("expected a JSON object")
    gpus_raw = doc.get("gpus", [])
    if not isinstance(gpus_raw, list):
        raise FixtureError("gpus: expected a list")
    attrs_raw = doc.get("cuda_attributes") or []
    if not isinstance(attrs_raw, list):
        raise FixtureError("cuda_attributes: expected a list (one entry per GPU, NVML order)")
    gpus = tuple(_gpu(g, attrs_raw[i] if i < len(attrs_raw) else None, f"gpus[{i}]") for i, g in enumerate(gpus_raw))
    indexes = [g.index for g in gpus]
    if len(set(indexes)) != len(indexes):
        raise FixtureError(f"gpus: duplicate index in {indexes}")
    p2p: dict[tuple[int, int], P2P] = {}
    p2p_raw = doc.get("p2p") or {}
    if not isinstance(p2p_raw, dict):
        raise FixtureError("p2p: expected an object keyed 'a->b'")
    for key, value in p2p_raw.items():
        try:
            a_s, b_s = key.split("->")
            pair = (int(a_s), int(b_s))
        except ValueError as exc:
            raise FixtureError(f"p2p: bad key {key!r}, expected 'a->b'") from exc
        if not isinstance(value, dict):
            raise FixtureError(f"p2p[{key}]: expected an object")
        p2p[pair] = P2P(
            **{cap: _int(value.get(cap), f"p2p[{key}].{cap}") for cap in P2P_CAPS},
            common_ancestor=_int(value.get("common_ancestor"), f"p2p[{key}].common_ancestor"),
        )
    env_raw = doc.get("env") or {}
    if not isinstance(env_raw, dict) or not all(isinstance(v, str) for v in env_raw.values()):
        raise FixtureError("env: expected an object of strings")
    errors_raw = doc.get("errors") or []
    if not isinstance(errors_raw, list) or not all(isinstance(e, str) for e in errors_raw):
        raise FixtureError(f"errors: expected a list of strings, got {short(errors_raw)}")
    exported = doc.get("multicast_create_exported")
    return Inventory(
        driver_version=_str(doc.get("driver_version"), "driver_version"),
        cuda_driver_version=_int(doc.get("cuda_driver_version"), "cuda_driver_version"),
        nvml_version=_str(doc.get("nvml_version"), "nvml_version"),
        gpus=gpus,
        p2p=p2p,
        multicast_create_exported=None if exported is None else bool(exported),
        host_env=dict(env_raw),
        host=_str(doc.get("host"), "host"),
        errors=tuple(errors_raw),
    )


def to_dict(inv: Inventory) -> dict[str, Any]:
    """The recorded-host format of ``inv`` (``from_dict(to_dict(inv)) == inv``)."""
    gpus: list[dict[str, Any]] = []
    attrs: list[dict[str, Any] | None] = []
    for g in inv.gpus:
        entry: dict[str, Any] = {
            "index": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "pci_bus_id": g.pci_bus_id,
            "memory_total_mib": g.memory_total_mib,
            "cc": list(g.cc) if g.cc else None,
            "nvlinks": [
                {"link": n.link, "active": int(n.active), "remote_type": n.remote_type, "version": n.version}
                for n in g.nvlinks
            ],
            "fabric_v2": None
            if g.fabric is None
            else {
                "state": g.fabric.state,
                "status": g.fabric.status,
                "cliqueId": g.fabric.clique_id,
                "clusterUuid": g.fabric.cluster_uuid,
                "healthMask": g.fabric.health_mask,
            },
            "compute_processes": g.compute_processes,
        }
        gpus.append(entry)
        attrs.append(
            None
            if g.cuda is None
            else {
                "MULTICAST_SUPPORTED": g.cuda.multicast_supported,
                "HANDLE_TYPE_FABRIC_SUPPORTED": g.cuda.fabric_handles,
                "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED": g.cuda.posix_fd_handles,
                "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": g.cuda.vmm,
            }
        )
    doc: dict[str, Any] = {
        "host": inv.host,
        "env": dict(inv.host_env),
        "nvml_version": inv.nvml_version,
        "driver_version": inv.driver_version,
        "cuda_driver_version": inv.cuda_driver_version,
        "multicast_create_exported": inv.multicast_create_exported,
        "gpus": gpus,
        "p2p": {
            f"{a}->{b}": {**{cap: getattr(p, cap) for cap in P2P_CAPS}, "common_ancestor": p.common_ancestor}
            for (a, b), p in sorted(inv.p2p.items())
        },
        "cuda_attributes": attrs,
        "errors": list(inv.errors),
    }
    return doc
