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

The format is written down once, in the fields below: each names its key (``schema.key``), how
the value is read and written, and what the report's inventory summary shows of it. ``from_dict``,
``to_dict``, ``summary`` and the native probe's readings follow those keys, so a new host field is
one field here (and, read from the hardware, one reading in ``native_probe``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from node_agent import schema
from node_agent.errors import FixtureError
from node_agent.schema import (
    BOOL_OR_NONE,
    FLAG,
    INT,
    INT_OR_NONE,
    TEXT,
    TEXT_MAP,
    TEXT_OR_NONE,
    TEXTS,
    Codec,
    Key,
    entries,
    key,
    optional,
    pairs,
    short,
)

FABRIC_STATE_COMPLETED = 3
"""``NVML_GPU_FABRIC_STATE_COMPLETED``."""
NVLINK_REMOTE_SWITCH = 2
"""``NVML_NVLINK_DEVICE_TYPE_SWITCH``."""
P2P_OK = 0
"""``NVML_P2P_STATUS_OK``."""
COMM_KERNEL_GENERATIONS: Final[Mapping[int, str]] = MappingProxyType({9: "Hopper", 10: "Blackwell"})
"""SM major -> GPU generation, for the GPUs FlashInfer 0.6.13 builds its trtllm and mnnvl
allreduce-fusion comm kernels for (``flashinfer/jit/comm.py``; 0.7.2 adds SM 12 to trtllm only). On
any other GPU neither backend exists. The one place of this fact: the probe's applicability check
and the simulated hardware's model both read it."""


def has_comm_kernels(cc: tuple[int, int]) -> bool:
    """Whether FlashInfer builds its allreduce-fusion comm kernels for compute capability ``cc``."""
    return cc[0] in COMM_KERNEL_GENERATIONS


def cc_text(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


def active_links(links: Sequence[NvLink]) -> int:
    return sum(1 for link in links if link.active)


def switch_links(links: Sequence[NvLink]) -> int:
    return sum(1 for link in links if link.active and link.remote_type == NVLINK_REMOTE_SWITCH)


# -- what a GPU-field summary shows: a function of the field's values, one per GPU -----------------


def _distinct(values: Sequence[Any]) -> list[Any]:
    return sorted({v for v in values if v is not None})


def _cc_texts(values: Sequence[tuple[int, int] | None]) -> list[str]:
    return sorted({cc_text(cc) for cc in values})


def _remote_types(values: Sequence[Sequence[NvLink]]) -> list[int]:
    return sorted({n.remote_type for links in values for n in links if n.active and n.remote_type is not None})


def _all_switched(values: Sequence[Sequence[NvLink]]) -> bool:
    return bool(values) and all(switch_links(links) > 0 for links in values)


def _fabrics(values: Sequence[Fabric | None]) -> dict[str, Any] | None:
    if all(f is None for f in values):
        return None
    return {
        "state": sorted({f.state for f in values if f is not None}),
        "completed": all(f is not None and f.completed for f in values),
        "cluster_uuid_zero": all(f is not None and not f.has_cluster for f in values),
        "cliques": sorted({f.clique for f in values if f is not None and f.has_cluster}),
    }


def _multicast_attributes(values: Sequence[CudaAttributes | None]) -> list[int | None]:
    return [c.multicast_supported if c else None for c in values]


# -- codecs of this format -------------------------------------------------------------------------


def _cc(raw: Any, where: str) -> tuple[int, int] | None:
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(x, int) for x in raw)):
        raise FixtureError(f"{where}: expected [major, minor]")
    return (raw[0], raw[1])


def _cluster_uuid(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise FixtureError(f"{where}: expected a string, got {short(raw)}")
    uuid = raw.replace("-", "").lower()
    if len(uuid) != 32 or any(c not in "0123456789abcdef" for c in uuid):
        raise FixtureError(f"{where}: expected 32 hex digits, got {short(uuid)}")
    return uuid


COMPUTE_CAPABILITY: Final = Codec(_cc, lambda cc: list(cc) if cc else None)
"""``[major, minor]``."""
CLUSTER_UUID: Final = Codec(_cluster_uuid)
"""32 hex digits, dashes allowed, read in lower case without them."""


# -- the host, field by field (each field's metadata is its key in the format) ---------------------


@dataclass(frozen=True)
class NvLink:
    link: int = field(metadata=key("link", INT))
    active: bool = field(metadata=key("active", FLAG))
    remote_type: int | None = field(default=None, metadata=key("remote_type", INT_OR_NONE))
    version: int | None = field(default=None, metadata=key("version", INT_OR_NONE))


@dataclass(frozen=True)
class Fabric:
    """``nvmlGpuFabricInfo`` (v2) of one GPU."""

    state: int = field(metadata=key("state", INT))
    status: int = field(default=0, metadata=key("status", INT))
    clique_id: int = field(default=0, metadata=key("cliqueId", INT))
    cluster_uuid: str = field(default="0" * 32, metadata=key("clusterUuid", CLUSTER_UUID))
    """32 lower-case hex digits; all zero on a single-node fabric."""
    health_mask: int = field(default=0, metadata=key("healthMask", INT))

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
    """CUDA driver device attributes, read without creating a context (``native``: the
    ``CUdevice_attribute`` id, CUDA 13.0 ``include/cuda.h``)."""

    multicast_supported: int | None = field(default=None, metadata=key("MULTICAST_SUPPORTED", INT_OR_NONE, native=132))
    """``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED``: necessary, not sufficient."""
    fabric_handles: int | None = field(
        default=None, metadata=key("HANDLE_TYPE_FABRIC_SUPPORTED", INT_OR_NONE, native=128)
    )
    posix_fd_handles: int | None = field(
        default=None, metadata=key("HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", INT_OR_NONE, native=103)
    )
    vmm: int | None = field(default=None, metadata=key("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", INT_OR_NONE, native=102))


@dataclass(frozen=True)
class Gpu:
    index: int = field(metadata=key("index", INT))
    name: str = field(default="unknown", metadata=key("name", TEXT, shows={"models": _distinct}))
    uuid: str = field(default="", metadata=key("uuid", TEXT))
    pci_bus_id: str = field(default="", metadata=key("pci_bus_id", TEXT))
    memory_total_mib: int | None = field(
        default=None, metadata=key("memory_total_mib", INT_OR_NONE, shows={"memory_mib": _distinct})
    )
    cc: tuple[int, int] | None = field(
        default=None, metadata=key("cc", COMPUTE_CAPABILITY, shows={"compute_capability": _cc_texts})
    )
    nvlinks: tuple[NvLink, ...] = field(
        default=(),
        metadata=key(
            "nvlinks",
            entries(NvLink, numbered="link"),
            shows={
                "nvlink_active": lambda values: [active_links(links) for links in values],
                "nvlink_to_nvswitch": lambda values: [switch_links(links) for links in values],
                "nvlink_remote_types": _remote_types,
                "nvswitch": _all_switched,
            },
        ),
    )
    fabric: Fabric | None = field(
        default=None,
        metadata=key("fabric_v2", optional(Fabric), read_also=("fabric_v3",), shows={"fabric": _fabrics}),
    )
    compute_processes: int = field(default=0, metadata=key("compute_processes", INT, shows={"compute_processes": list}))
    cuda: CudaAttributes | None = field(
        default=None,
        metadata=key(
            "cuda_attributes",
            optional(CudaAttributes),
            beside=True,
            shows={"multicast_attribute": _multicast_attributes},
        ),
    )
    """Recorded beside the GPU entries, in the document's ``cuda_attributes`` (one per GPU, NVML order)."""

    @property
    def active_links(self) -> int:
        return active_links(self.nvlinks)

    @property
    def switch_links(self) -> int:
        return switch_links(self.nvlinks)

    @property
    def cc_str(self) -> str:
        return cc_text(self.cc)


@dataclass(frozen=True)
class P2P:
    """``nvmlDeviceGetP2PStatus`` per capability (0 = OK; ``native``: its ``nvmlGpuP2PCapsIndex_t``)
    and the PCIe common ancestor level."""

    read: int | None = field(default=None, metadata=key("read", INT_OR_NONE, native=0))
    write: int | None = field(default=None, metadata=key("write", INT_OR_NONE, native=1))
    nvlink: int | None = field(default=None, metadata=key("nvlink", INT_OR_NONE, native=2))
    atomics: int | None = field(default=None, metadata=key("atomics", INT_OR_NONE, native=3))
    pci: int | None = field(default=None, metadata=key("pci", INT_OR_NONE, native=4))
    common_ancestor: int | None = field(default=None, metadata=key("common_ancestor", INT_OR_NONE))


def _read_gpus(raw: Any, where: str) -> tuple[Gpu, ...]:
    if not isinstance(raw, list):
        raise FixtureError(f"{where}: expected a list")
    return tuple(schema.read(Gpu, g, f"{where}[{i}]") for i, g in enumerate(raw))


def _beside_list(doc: Mapping[str, Any], name: str) -> list[Any]:
    items = doc.get(name) or []
    if not isinstance(items, list):
        raise FixtureError(f"{name}: expected a list (one entry per GPU, NVML order)")
    return items


@dataclass(frozen=True)
class _GpuList(Codec):
    """``gpus``: the GPU entries, and beside them one list per ``beside`` field of ``Gpu`` (one entry
    per GPU, NVML order; a short list leaves the last GPUs without). GPU indexes are unique."""

    def read_in(self, entry: Mapping[str, Any], key: Key, where: str, required: bool) -> Any:
        beside = {f: _beside_list(entry, f.key.name) for f in schema.fields(Gpu) if f.key.beside}
        raw = entry.get(key.name, [])
        gpus: list[Gpu] = []
        for i, gpu in enumerate(self.read(raw, schema.path(where, key.name))):
            found = {
                f.attr: f.key.codec.read(items[i] if i < len(items) else None, f"{f.key.name}[{raw[i].get('index')}]")
                for f, items in beside.items()
            }
            gpus.append(dataclasses.replace(gpu, **found))
        indexes = [g.index for g in gpus]
        if len(set(indexes)) != len(indexes):
            raise FixtureError(f"{schema.path(where, key.name)}: duplicate index in {indexes}")
        return tuple(gpus)

    def write_in(self, value: Any, key: Key) -> dict[str, Any]:
        recorded = super().write_in(value, key)
        for f in schema.fields(Gpu):
            if f.key.beside:
                recorded[f.key.name] = [f.key.codec.write(getattr(g, f.attr)) for g in value]
        return recorded


GPU_LIST: Final = _GpuList(_read_gpus, lambda gpus: [schema.write(g) for g in gpus])


# -- what a host-field summary shows: a function of the inventory ----------------------------------


def _nvlink_pairs(inv: Inventory) -> str:
    pairs = [(a.index, b.index) for i, a in enumerate(inv.gpus) for b in inv.gpus[i + 1 :]]
    nvlink = [inv.nvlink_p2p(a, b) for a, b in pairs]
    if not pairs:
        return "n/a"
    return "all pairs" if all(nvlink) else ("none" if not any(nvlink) else "some pairs")


@dataclass(frozen=True)
class Inventory:
    driver_version: str | None = field(metadata=key("driver_version", TEXT_OR_NONE))
    cuda_driver_version: int | None = field(metadata=key("cuda_driver_version", INT_OR_NONE))
    gpus: tuple[Gpu, ...] = field(metadata=key("gpus", GPU_LIST, shows={"gpus": lambda inv: len(inv.gpus)}))
    nvml_version: str | None = field(default=None, metadata=key("nvml_version", TEXT_OR_NONE))
    p2p: Mapping[tuple[int, int], P2P] = field(
        default_factory=dict, metadata=key("p2p", pairs(P2P), shows={"p2p_nvlink": _nvlink_pairs})
    )
    multicast_create_exported: bool | None = field(
        default=None,
        metadata=key(
            "multicast_create_exported",
            BOOL_OR_NONE,
            shows={"cuMulticastCreate_exported": lambda inv: inv.multicast_create_exported},
        ),
    )
    host_env: Mapping[str, str] = field(default_factory=dict, metadata=key("env", TEXT_MAP))
    """The host-policy variables the host sets (only those; never the whole environment)."""
    host: str | None = field(default=None, metadata=key("host", TEXT_OR_NONE))
    errors: tuple[str, ...] = field(
        default=(), metadata=key("errors", TEXTS, shows={"errors": lambda inv: list(inv.errors)})
    )

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
        ident = "|".join([self.driver_version or "", *sorted(g.uuid for g in self.gpus)])
        return hashlib.sha256(ident.encode()).hexdigest()[:16]


HOST_KEYS: Final = (
    "host", "recorded_at", "recorded_by", "env", "nvml_version", "driver_version", "cuda_driver_version",
    "multicast_create_exported", "gpus", "p2p", "cuda_attributes", "errors",
)  # fmt: skip
"""The recorded order of the host document's keys, with the native probe's provenance
(``recorded_at``, ``recorded_by``); keys not named here follow them."""
GPU_KEYS: Final = tuple(f.key.name for f in schema.fields(Gpu) if not f.key.beside)
"""The recorded order of a GPU entry's keys."""
P2P_CAPS: Final = tuple(f.key.name for f in schema.fields(P2P) if f.key.native is not None)
"""``nvmlGpuP2PCapsIndex_t`` names in index order (0..4)."""


def from_dict(doc: Mapping[str, Any]) -> Inventory:
    """Parse the recorded-host format; raises ``FixtureError`` with the offending path."""
    if not isinstance(doc, Mapping):
        raise FixtureError("expected a JSON object")
    return schema.read(Inventory, doc, "")


def to_dict(inv: Inventory) -> dict[str, Any]:
    """The recorded-host format of ``inv`` (``from_dict(to_dict(inv)) == inv``)."""
    return schema.in_order(schema.write(inv), HOST_KEYS)


def summary(inv: Inventory) -> dict[str, Any]:
    """The report's GPU summary: what each field ``shows`` (``schema.Key``), in field order; a host
    field's entries are functions of the inventory, and after ``gpus`` come the GPU fields' entries,
    functions of the field's values (one per GPU)."""
    shown: dict[str, Any] = {}
    for f in schema.fields(Inventory):
        shown.update({name: of(inv) for name, of in f.key.shows.items()})
        if f.key.codec is GPU_LIST:
            for g in schema.fields(Gpu):
                values = tuple(getattr(gpu, g.attr) for gpu in inv.gpus)
                shown.update({name: of(values) for name, of in g.key.shows.items()})
    return shown
