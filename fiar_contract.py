"""The public contract between fiar's node agent and operator: label keys, values and annotations.

Both components import these names and nothing else from each other; docs/DESIGN.md is the
source. Values are exact strings: vLLM accepts only ``auto``, ``trtllm`` and ``mnnvl`` (lower case)
for ``VLLM_FLASHINFER_ALLREDUCE_BACKEND`` and raises ``ValueError`` on anything else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

PREFIX: Final = "fiar.io/"

# -- Backends: the one list. A new backend value starts here (docs/DESIGN.md#adding-a-backend) ---------
Backend = Literal["mnnvl", "trtllm"]
"""A FlashInfer allreduce backend the agent tests and a policy may allow."""
BACKENDS: Final[tuple[Backend, ...]] = ("mnnvl", "trtllm")
"""In order of preference: the agent tests them in this order and its verdict is the first that
passed; a policy's default ``backends``."""
NO_BACKEND: Final = "none"
"""The verdict of a node that verified no backend (only from a conclusive probe: docs/DESIGN.md#verdict-none)."""
AUTO: Final = "auto"
"""vLLM's own choice: the only value of ``VLLM_FLASHINFER_ALLREDUCE_BACKEND`` that is not a backend."""
Verdict = Literal[Backend, "none"]
EnvValue = Literal["auto", Backend]

# -- Node labels, written by the agent on its own Node only -----------------------------------------
LABEL_BACKEND: Final = "fiar.io/backend"
"""The verified recommendation: one of BACKEND_VERDICTS."""
LABEL_MULTICAST: Final = "fiar.io/multicast"
"""One of MULTICAST_STATES."""
LABEL_MULTICAST_USABLE: Final = "fiar.io/multicast-usable"
"""One of MULTICAST_USABLE_STATES: whether every consumer of NVLink multicast (FlashInfer's mnnvl, NCCL's
NVLS, PyTorch's symmetric memory, NVSHMEM) may use it on this node; the multicast guard reads it."""
LABEL_MNNVL_WORKSPACE: Final = "fiar.io/mnnvl-workspace"
"""How the mnnvl smoke test's workspace creation ended (one of MNNVL_WORKSPACE_STATES); absent when the
test did not get as far as creating one. What an engine's own workspace creation does on the node."""


def result_label(backend: Backend) -> str:
    """The label holding ``backend``'s smoke-test result (one of TEST_RESULTS): ``fiar.io/<backend>``."""
    return PREFIX + backend


RESULT_LABELS: Final = tuple(result_label(b) for b in BACKENDS)
"""The smoke-test result label of every backend, in order of preference."""
LABEL_MNNVL: Final = result_label("mnnvl")
LABEL_TRTLLM: Final = result_label("trtllm")
LABEL_GPUS: Final = "fiar.io/gpus"
"""Number of GPUs, as a decimal string."""
LABEL_CLIQUE: Final = "fiar.io/clique"
"""``<clusterUUID>.<cliqueId>`` when the NVLink fabric reports one; absent otherwise."""
LABEL_FLASHINFER: Final = "fiar.io/flashinfer"
"""The flashinfer-python version the node's smoke tests imported (the kernels its verdict was made with;
the installed one where no test ran); absent when not known or not a plain release number."""
LABEL_COMPUTE_CAPABILITY: Final = "fiar.io/compute-capability"
"""The CUDA compute capability every GPU of the node shares, ``<major>.<minor>`` (``9.0``: H100/H200;
``10.0``: B200/GB200; ``10.3``: B300); absent when the GPUs differ or one could not be read. The GPU
generation an engine's own backend choice depends on (SGLang: ``operator/fiar_operator/core/sglang.py``)."""

LABEL_GFD_CLIQUE: Final = "nvidia.com/gpu.clique"
"""The same ``<clusterUUID>.<cliqueId>``, written by NVIDIA GPU Feature Discovery; read, never written."""

AGENT_LABELS: Final = (
    LABEL_BACKEND,
    LABEL_MULTICAST,
    LABEL_MULTICAST_USABLE,
    LABEL_MNNVL_WORKSPACE,
    *RESULT_LABELS,
    LABEL_GPUS,
    LABEL_CLIQUE,
    LABEL_COMPUTE_CAPABILITY,
    LABEL_FLASHINFER,
)

# -- Node annotations ---------------------------------------------------------------------------------
ANNOTATION_PROBE_REPORT: Final = "fiar.io/probe-report"
"""Versioned JSON report of the last probe (written by the agent)."""
ANNOTATION_REPROBE: Final = "fiar.io/reprobe"
"""Set by an admin to ask the agent for a new probe; the agent clears it."""

# -- The probe report (fiar.io/probe-report): one host format, written by the agent, read by kubectl fiar ---
PROBE_REPORT_SCHEMA: Final = "fiar.io/probe-report"
PROBE_REPORT_VERSION: Final = 1
PROBE_REPORT_MAX_READ_CHARS: Final = 256 * 1024
"""A longer report is not read at all (the API server's budget for all annotations of an object)."""
PROBE_REPORT_SHAPES: Final[Mapping[str, type]] = {
    "labels": dict,
    "tests": dict,
    "policy": dict,
    "inventory": dict,
    "versions": dict,
    "benchmark": dict,
    "reasons": list,
    "fingerprint": str,
    "probe_time": str,
}
"""The JSON type of each top-level key the report may hold (absent or null is allowed)."""


def parse_probe_report(text: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None), or (None, why it is not one, in bounded words); never raises, whatever the text.

    The one reading of the host format: the agent reads its previous report through it, and
    ``kubectl fiar`` the report it shows. A report too large, not JSON, nested too deeply, of another
    schema or version, or with a top-level key of the wrong type is no report.
    """
    if not text:
        return None, "no probe report"
    if len(text) > PROBE_REPORT_MAX_READ_CHARS:
        return None, f"probe report of {len(text)} characters, over the {PROBE_REPORT_MAX_READ_CHARS} read limit"
    try:
        doc = json.loads(text)
    except Exception as exc:  # ValueError, RecursionError (deep nesting), MemoryError, ...
        return None, f"probe report is not JSON ({type(exc).__name__})"
    if not isinstance(doc, dict):
        return None, f"probe report is a JSON {type(doc).__name__}, not an object"
    if doc.get("schema") != PROBE_REPORT_SCHEMA or doc.get("version") != PROBE_REPORT_VERSION:
        schema, version = (json.dumps(doc.get(k), default=str)[:60] for k in ("schema", "version"))
        return None, f"probe report of schema {schema} version {version}"
    for key, kind in PROBE_REPORT_SHAPES.items():
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            return None, f"probe report's {key} is a {type(doc[key]).__name__}, not a {kind.__name__}"
    return doc, None


# -- Node condition, written by the agent on its own Node's status only ---------------------------------
CONDITION_VERIFIED: Final = "FiarAllreduceVerified"
"""True: the node verified a backend; False: verdict ``none``; Unknown: no verdict (node_agent/condition.py)."""

# -- Pod metadata, written by the operator ------------------------------------------------------------
LABEL_POD_POLICY: Final = "fiar.io/policy"
"""Name of the FiAllreducePolicy that manages the pod."""
ANNOTATION_POD_BACKEND: Final = "fiar.io/backend"
"""The backend the pod's containers read through a fieldRef."""
ANNOTATION_POD_DECISION: Final = "fiar.io/decision"
"""JSON: node, node verdict, policy, reason."""
ANNOTATION_POD_FUSE_ALLREDUCE_RMS: Final = "fiar.io/fuse-allreduce-rms"
"""``false`` (fiar turns vLLM's AR+RMSNorm fusion off) or ``null`` (vLLM's own setting): a JSON literal
the container's command reads through ``$(FIAR_FUSE_ALLREDUCE_RMS)``."""
ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: Final = "fiar.io/allreduce-use-flashinfer"
"""``0`` or ``1``: the value of ``VLLM_ALLREDUCE_USE_FLASHINFER`` in containers whose fusion fiar controls."""
NAMESPACE_IGNORE_LABEL: Final = "fiar.io/ignore"
"""Namespaces with this label are never seen by the webhooks."""

ENV_VAR: Final = "VLLM_FLASHINFER_ALLREDUCE_BACKEND"
ENV_ALLREDUCE_USE_FLASHINFER: Final = "VLLM_ALLREDUCE_USE_FLASHINFER"
"""vLLM's switch for the standalone FlashInfer allreduce, which uses the fusion's workspace."""
ENV_FUSE_ALLREDUCE_RMS: Final = "FIAR_FUSE_ALLREDUCE_RMS"
"""Injected variable holding ANNOTATION_POD_FUSE_ALLREDUCE_RMS; usable inside a JSON --compilation-config."""
ENV_VLLM_ARGS: Final = "FIAR_VLLM_ARGS"
"""Injected variable holding one vLLM flag, ``-cc.pass_config.fuse_allreduce_rms=<value>``: the placeholder
a shell-string command puts after ``vllm serve``."""
ANNOTATION_POD_SGLANG_FLAG: Final = "fiar.io/sglang-flag"
"""One SGLang option, written without its leading ``--`` (one of SGLANG_FLAGS): what an SGLang container's
command reads through ``--$(FIAR_SGLANG_FLAG)`` (operator/fiar_operator/core/sglang.py)."""
ENV_SGLANG_FLAG: Final = "FIAR_SGLANG_FLAG"
"""Injected variable holding ANNOTATION_POD_SGLANG_FLAG."""
ENV_SGLANG_ARGS: Final = "FIAR_SGLANG_ARGS"
"""Injected variable holding ``--$(FIAR_SGLANG_FLAG)``: the token fiar puts in an SGLang command, and the
placeholder a shell string puts right after ``sglang.launch_server``."""
IMEX_CHANNEL_DEVICE_CLASS: Final = "compute-domain-default-channel.nvidia.com"
"""DeviceClass of the IMEX channel a ComputeDomain (NVIDIA DRA driver) gives the pods that claim it."""

# -- Values ----------------------------------------------------------------------------------------
Fusion = Literal["on", "off"]
"""on: the container's own fusion settings (vLLM's default unless it sets them); off: fiar turns it off."""
Multicast = Literal["supported", "unsupported", "disabled", "unknown"]
MulticastUsable = Literal["verified", "broken", "absent", "forbidden", "unknown"]
"""verified: the mnnvl test passed; broken: the GPUs say multicast is supported, but the mnnvl test failed
or the NVLink fabric is not complete; absent: the GPUs or the driver have no multicast; forbidden: the
host policy turns it off; unknown: not proved either way (node_agent/verdict.py ``multicast_usable``)."""
MnnvlWorkspace = Literal["created", "no-multicast", "failed-on-every-rank"]
"""created: every rank got a workspace with a multicast pointer; no-multicast: every GPU's multicast
attribute reads 0, so FlashInfer refuses an mnnvl workspace before any collective; failed-on-every-rank:
the attribute reads 1, and creating the workspace failed on every rank (a null multicast pointer or an
error binding it)."""
TestResult = Literal["pass", "fail", "timeout", "skipped"]

BACKEND_VERDICTS: Final[tuple[Verdict, ...]] = (*BACKENDS, NO_BACKEND)
ENV_VALUES: Final[tuple[EnvValue, ...]] = (AUTO, *reversed(BACKENDS))
"""``auto`` first, then the backends from the least preferred (the order the CRD lists them)."""
MULTICAST_STATES: Final[tuple[Multicast, ...]] = ("supported", "unsupported", "disabled", "unknown")
MULTICAST_USABLE_STATES: Final[tuple[MulticastUsable, ...]] = ("verified", "broken", "absent", "forbidden", "unknown")
MULTICAST_VERIFIED: Final = "verified"
MNNVL_WORKSPACE_STATES: Final[tuple[MnnvlWorkspace, ...]] = ("created", "no-multicast", "failed-on-every-rank")
TEST_RESULTS: Final[tuple[TestResult, ...]] = ("pass", "fail", "timeout", "skipped")
FUSE_ALLREDUCE_RMS: Final[dict[Fusion, str]] = {"on": "null", "off": "false"}
ALLREDUCE_USE_FLASHINFER: Final[dict[Fusion, str]] = {"on": "1", "off": "0"}
SglangFlag = Literal["off", "engine"]
SGLANG_FLAGS: Final[dict[SglangFlag, str]] = {
    "off": "enforce-disable-flashinfer-allreduce-fusion",
    "engine": "log-level=info",
}
"""off: SGLang's own switch that wins over every model adjustment; engine: SGLang's own choice (no
option says "unset" for the fusion, so this one restates a default and sits before the user's options,
whose own --log-level comes later and wins)."""


@dataclass(frozen=True)
class GuardVariable:
    """One consumer of NVLink multicast and the variable that keeps it off (docs/multicast-guard.md)."""

    env: str
    annotation: str
    """The pod annotation the injected variable reads through a fieldRef."""
    off: str
    """The value that keeps the consumer off multicast."""
    own: str
    """The value that leaves the consumer on its own default (what an unset variable does)."""
    consumer: str


MULTICAST_GUARD: Final[tuple[GuardVariable, ...]] = (
    GuardVariable("NCCL_NVLS_ENABLE", PREFIX + "nccl-nvls-enable", "0", "", "NCCL NVLS (NVLink SHARP)"),
    GuardVariable(
        "TORCH_SYMM_MEM_DISABLE_MULTICAST",
        PREFIX + "torch-symm-mem-disable-multicast",
        "1",
        "0",
        "PyTorch symmetric memory (and vLLM's symmetric-memory allreduce)",
    ),
    GuardVariable("NVSHMEM_DISABLE_NVLS", PREFIX + "nvshmem-disable-nvls", "1", "0", "NVSHMEM NVLS"),
)
"""The multicast guard: one row per consumer. A container bound to a node whose multicast is not
``verified`` reads ``off``; elsewhere ``own``. A new consumer is one row here."""
GUARD_ENV: Final = frozenset(g.env for g in MULTICAST_GUARD)

POD_ANNOTATION_VALUES: Final[dict[str, frozenset[str]]] = {
    ANNOTATION_POD_BACKEND: frozenset(ENV_VALUES),
    ANNOTATION_POD_FUSE_ALLREDUCE_RMS: frozenset(FUSE_ALLREDUCE_RMS.values()),
    ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: frozenset(ALLREDUCE_USE_FLASHINFER.values()),
    **{g.annotation: frozenset({g.off, g.own}) for g in MULTICAST_GUARD},
    ANNOTATION_POD_SGLANG_FLAG: frozenset(SGLANG_FLAGS.values()),
}
"""Every ``fiar.io/`` pod annotation a container reads (through a fieldRef env var, and from there
into its command line or a shell), with the only values it may hold. The chart's admission policy
``pod-annotation-values`` refuses any other value from every writer but the cluster admin; the
operator reads a value outside it as absent. A new annotation a container reads is one row here."""


def pod_annotation_value(key: str, raw: object) -> str | None:
    """``raw`` (pod annotation ``key``) when it is one of the values a container may read, else None."""
    allowed = POD_ANNOTATION_VALUES.get(key)
    return raw if allowed is not None and isinstance(raw, str) and raw in allowed else None


# Host-policy variables: any of these set to its value means "multicast is disabled by the host".
HOST_POLICY_ENV: Final = {g.env: g.off for g in MULTICAST_GUARD}


def backend_value(raw: object) -> Backend | None:
    """``raw`` as a backend, or None: a label or spec value is untrusted input."""
    return next((b for b in BACKENDS if b == raw), None)


def compute_capability_text(cc: tuple[int, int]) -> str:
    """The ``fiar.io/compute-capability`` value of ``cc``: ``(9, 0)`` -> ``9.0``."""
    return f"{cc[0]}.{cc[1]}"


_CC_TEXT: Final = re.compile(r"([1-9][0-9]?)\.([0-9])")


def compute_capability_value(raw: object) -> tuple[int, int] | None:
    """``raw`` (a ``fiar.io/compute-capability`` label) as (major, minor), or None when absent or not of
    the form the agent writes: a label value is untrusted input."""
    found = _CC_TEXT.fullmatch(raw) if isinstance(raw, str) else None
    return (int(found.group(1)), int(found.group(2))) if found else None


_FLASHINFER_TEXT: Final = re.compile(r"[0-9]{1,4}(\.[0-9]{1,4}){1,3}(\.post[0-9]{1,3})?")


def flashinfer_value(raw: object) -> str | None:
    """``raw`` (a FlashInfer version, or a ``fiar.io/flashinfer`` label) when it is a plain release number
    such as ``0.7.2.post1`` (which is also a label value), else None: untrusted input."""
    return raw if isinstance(raw, str) and _FLASHINFER_TEXT.fullmatch(raw) else None


def verdict_value(raw: object) -> Verdict | None:
    """``raw`` (a ``fiar.io/backend`` label) as a verdict, or None when absent or not one of ours."""
    return next((v for v in BACKEND_VERDICTS if v == raw), None)


def runs_an_older_decision(decision: Mapping[str, Any] | None, container_starts: Iterable[str]) -> bool:
    """Whether a running container started before the pod's backend (or fusion, or guard) last changed: it still
    runs the old value (``fiar.io/decision`` of trigger ``reconcile``; ``container_starts``: the
    ``startedAt`` of the running containers). Read by the operator (status ``stale``) and ``kubectl fiar``."""
    doc = decision
    if not doc or doc.get("trigger") != "reconcile" or not doc.get("time"):
        return False
    if (
        doc.get("previous") == doc.get("backend")
        and doc.get("previousFusion", doc.get("fusion")) == doc.get("fusion")
        and doc.get("previousGuard", doc.get("guard")) == doc.get("guard")
    ):
        return False
    # Both times have one-second resolution; a start in the same second as the change counts as
    # before it, so a pod is never reported current while it may still run the old value.
    decided = str(doc["time"])[:19]
    return any(str(started)[:19] <= decided for started in container_starts)


# -- Custom resource -----------------------------------------------------------------------------------
GROUP: Final = "fiar.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "fiallreducepolicies"
KIND: Final = "FiAllreducePolicy"
SHORT_NAME: Final = "fiarp"

# -- Images ---------------------------------------------------------------------------------------------
LABEL_ARCH: Final = "kubernetes.io/arch"
"""The kubelet's label of a node's CPU architecture (Go's GOARCH: ``amd64``, ``arm64``); read, never written."""
IMAGE_ARCHITECTURES: Final = ("amd64", "arm64")
"""The CPU architectures every fiar image (operator, agent, agent-sim) is built for, each image one
multi-architecture index: tools/devcluster/images.py builds these, the chart's ``architectures`` defaults
to them, and ``kubectl fiar status`` says "no agent for arch X" of a GPU node of any other."""
