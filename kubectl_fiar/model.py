"""Facts to view model: what ``kubectl fiar`` shows, from the raw Node, Pod and policy objects.

Pure functions, no I/O. Every value read here was written by someone who may be hostile (a label
anyone with ``patch nodes`` may set, a pod annotation its owner may forge, a probe report of any
size): nothing here raises on bad input. Strings that reach a terminal go through ``clean`` (control
characters and escape sequences removed, length bounded); a value that is not one of the contract's
reads as such ("invalid"), never as a verdict.

Objects are reduced to small records as they are read (``node_record``, ``pod_record``,
``policy_record``), so a fleet of 10,000 nodes and 20,000 pods is never held as JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import fiar_contract as contract

MAX_DECISION_CHARS: Final = 4096
"""A longer ``fiar.io/decision`` is not parsed (the operator writes about 200 characters)."""
MAX_TEXT: Final = 160
"""Characters of one untrusted string shown."""
GPU_PRESENT: Final = "nvidia.com/gpu.present"
GPU_PRODUCT: Final = "nvidia.com/gpu.product"
UNPROBED: Final = "unprobed"
INVALID: Final = "invalid"
VERDICT_ORDER: Final = (*contract.BACKEND_VERDICTS, UNPROBED, INVALID)
"""Groups in the order they are shown: verified backends first, then none, unprobed, invalid."""
DEFAULT_PROBE_MAX_AGE_S: Final = 7 * 3600.0
"""A probe older than this needs attention: the agent probes every 6 h by default."""

_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
"""A terminal's CSI sequence (colours, cursor moves, clearing the screen): dropped whole."""
HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})
"""Unicode categories never printed as they are: controls (Cc), format characters (Cf: every bidi
mark, embedding, override and isolate, such as U+200F RIGHT-TO-LEFT MARK and U+061C ARABIC LETTER MARK,
and zero-width characters), surrogates, unassigned code points, line and paragraph separators."""
BIDI_CONTROLS: Final = frozenset({"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"})
"""Bidirectional classes that reorder the text after them (all Cf today; held here by class as well)."""


def _shown(char: str) -> str:
    hidden = unicodedata.category(char) in HIDDEN_CATEGORIES or unicodedata.bidirectional(char) in BIDI_CONTROLS
    return " " if hidden else char


def clean(value: object, limit: int = MAX_TEXT) -> str:
    """An untrusted value as one line of printable text of at most ``limit`` characters: no terminal
    sequence, control, format (bidi) or separator character survives; each becomes a space."""
    text = value if isinstance(value, str) else ("" if value is None else json.dumps(value, default=str)[: limit * 2])
    text = "".join(map(_shown, _ESCAPE.sub(" ", text[: limit * 4])))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_time(raw: object) -> float | None:
    """An RFC 3339 time (``2026-12-02T06:00:00Z``) as a Unix timestamp, or None."""
    if not isinstance(raw, str) or not 10 <= len(raw) <= 40:
        return None
    try:
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def age(seconds: float | None) -> str:
    """kubectl's age format: 45s, 12m, 5h, 3d (``-`` when unknown, ``0s`` for a time in the future)."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size * (2 if unit != "m" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def _str_map(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


# -- the probe report ------------------------------------------------------------------------------
def parse_report(text: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None) or (None, why it is not one): the agent's own reading (``fiar_contract.parse_probe_report``)."""
    return contract.parse_probe_report(text)


@dataclass(frozen=True)
class TestView:
    backend: str
    result: str
    kind: str = ""
    reason: str = ""
    ranks: int | None = None
    seconds: float | None = None
    reused_from: str = ""
    degraded: bool = False
    vs_nccl: float | None = None
    """Geometric-mean latency ratio to NCCL of the benchmark, where it ran."""
    recommended: bool | None = None


@dataclass(frozen=True)
class ReportView:
    """A probe report in words: only what ``why NODE`` shows, each value checked and bounded."""

    probe_time: str = ""
    status: str = ""
    hardware: str = ""
    agent: str = ""
    duration_s: float | None = None
    models: tuple[str, ...] = ()
    gpus: int | None = None
    compute_capability: tuple[str, ...] = ()
    driver: str = ""
    cuda_driver: str = ""
    torch: str = ""
    flashinfer: str = ""
    nccl: str = ""
    nvswitch: bool | None = None
    p2p_nvlink: str = ""
    fabric: str = ""
    multicast_attribute: str = ""
    inventory_error: str = ""
    multicast_forbidden_by: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    tests: tuple[TestView, ...] = ()
    kept_from: str = ""


def _num(raw: object) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    value = float(raw)
    return value if value == value and abs(value) < 1e12 else None


def _int(raw: object) -> int | None:
    value = _num(raw)
    return int(value) if value is not None and value == int(value) else None


def _strs(raw: object, limit: int = 16) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(clean(v) for v in raw[:limit] if isinstance(v, (str, int, float)) and not isinstance(v, bool))


def _dict(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, dict) else {}


def _list(raw: object) -> list[Any]:
    return raw if isinstance(raw, list) else []


def report_view(doc: Mapping[str, Any]) -> ReportView:
    inv = _dict(doc.get("inventory"))
    versions = _dict(doc.get("versions"))
    policy = _dict(doc.get("policy"))
    bench = _dict(doc.get("benchmark"))
    tests = []
    for name in contract.BACKENDS:
        entry = _dict(_dict(doc.get("tests")).get(name))
        if not entry:
            continue
        b = _dict(bench.get(name))
        recommended = b.get("recommended")
        tests.append(
            TestView(
                backend=name,
                result=clean(entry.get("result"), 20) or "?",
                kind=clean(entry.get("kind"), 40),
                reason=clean(entry.get("reason"), 400),
                ranks=_int(entry.get("ranks")),
                seconds=_num(entry.get("duration_s")),
                reused_from=clean(entry.get("reused_from"), 40),
                degraded=entry.get("degraded") is True,
                vs_nccl=_num(b.get("geomean_ratio_vs_nccl")),
                recommended=recommended if isinstance(recommended, bool) else None,
            )
        )
    fabric = _dict(inv.get("fabric"))
    fabric_text = ""
    if fabric:
        cliques = _strs(fabric.get("cliques"), 4)
        done = "registered" if fabric.get("completed") is True else "not registered"
        fabric_text = f"{done}, clique {', '.join(cliques)}" if cliques else f"{done}, no clique"
    attribute = inv.get("multicast_attribute")
    attr_text = ""
    if isinstance(attribute, list) and attribute:
        values = {str(v) for v in attribute[:1024]}
        attr_text = values.pop() if len(values) == 1 else "mixed"
    forbidden = policy.get("multicast_forbidden") is True
    return ReportView(
        probe_time=clean(doc.get("probe_time"), 40),
        status=clean(doc.get("status"), 20),
        hardware=clean(doc.get("hardware"), 100),
        agent=clean(doc.get("agent"), 40),
        duration_s=_num(doc.get("duration_s")),
        models=_strs(inv.get("models"), 4),
        gpus=_int(inv.get("gpus")),
        compute_capability=_strs(inv.get("compute_capability"), 4),
        driver=clean(versions.get("driver"), 40),
        cuda_driver=clean(versions.get("cuda_driver"), 40),
        torch=clean(versions.get("torch"), 40),
        flashinfer=clean(versions.get("flashinfer"), 40),
        nccl=clean(versions.get("nccl"), 40),
        nvswitch=inv.get("nvswitch") if isinstance(inv.get("nvswitch"), bool) else None,
        p2p_nvlink=clean(inv.get("p2p_nvlink"), 40),
        fabric=fabric_text,
        multicast_attribute=attr_text,
        inventory_error=clean(inv.get("error"), 300),
        multicast_forbidden_by=(_strs(policy.get("sources"), 8) or ("host policy",)) if forbidden else (),
        labels={clean(k, 63): clean(v, 63) for k, v in _str_map(doc.get("labels")).items()},
        reasons=tuple(clean(r, 400) for r in (doc.get("reasons") or [])[:32] if isinstance(r, str)),
        tests=tuple(tests),
        kept_from=clean(doc.get("labels_kept_from"), 40),
    )


# -- nodes -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeView:
    name: str
    verdict: str
    """A verdict of the contract, ``unprobed`` (no ``fiar.io/backend``) or ``invalid`` (not one of ours)."""
    model: str
    gpus: str
    multicast: str
    results: Mapping[str, str]
    clique: str
    probe_time: float | None
    status: str
    """The report's status (``ok``, ``degraded``), or ``-``."""
    reason: str
    report_problem: str | None
    """Why the probe report could not be read (None: read, or no verdict and no report)."""
    condition: str = "-"
    """The node condition ``FiarAllreduceVerified`` as ``status (reason)``, or ``-`` where the agent wrote none."""
    condition_differs: bool = False
    """The condition's status is not the one the verdict label gives (True, False, Unknown)."""
    labels_differ: tuple[str, ...] = ()
    """Verdict labels whose value on the node differs from the report's (someone else wrote them)."""
    report: ReportView | None = None

    def age_s(self, now: float) -> float | None:
        return None if self.probe_time is None else now - self.probe_time


def _label(labels: Mapping[str, str], key: str, allowed: Sequence[str]) -> str:
    raw = labels.get(key)
    if raw is None:
        return "-"
    return raw if raw in allowed else INVALID


def no_agent_arch(labels: Mapping[str, str]) -> str | None:
    """The node's architecture when fiar ships no image for it (its agent never runs there), else None."""
    arch = labels.get(contract.LABEL_ARCH)
    return None if arch is None or arch in contract.IMAGE_ARCHITECTURES else clean(arch, 20)


def _verdict_reason(verdict: str, report: ReportView | None, problem: str | None, arch: str | None = None) -> str:
    if verdict == UNPROBED:
        if report is not None and report.reasons:
            return f"no verdict yet: {report.reasons[-1]}"
        if problem is not None and problem != "no probe report":
            return f"no verdict yet, and {problem}"
        if arch is not None:
            shipped = ", ".join(contract.IMAGE_ARCHITECTURES)
            return f"no agent for arch {arch}: fiar's images exist for {shipped} only"
        return "no verdict yet: no fiar agent has probed this node"
    if verdict == INVALID:
        return "fiar.io/backend holds a value that is not a verdict: pods get the fallback here"
    if report is None:
        return f"verdict {verdict}, but {problem or 'no probe report'}"
    # the agent's sentence for the verdict ("backend none: ..."), else its backend's test ("mnnvl passed ...")
    for prefix in (f"backend {verdict}", f"{verdict} "):
        found = next((r for r in report.reasons if r.startswith(prefix)), None)
        if found is not None:
            return found
    return report.reasons[-1] if report.reasons else f"verdict {verdict}"


def node_record(node: Mapping[str, Any], *, keep_report: bool = False) -> NodeView | None:
    """A Node as its view; None for a node that is neither a GPU node nor labelled by fiar."""
    meta = _dict(node.get("metadata"))
    labels = _str_map(meta.get("labels"))
    annotations = _str_map(meta.get("annotations"))
    name = clean(meta.get("name"), 253) or "?"
    fiar = any(k.startswith(contract.PREFIX) for k in labels) or contract.ANNOTATION_PROBE_REPORT in annotations
    if not fiar and labels.get(GPU_PRESENT) != "true":
        return None
    raw = labels.get(contract.LABEL_BACKEND)
    verdict = UNPROBED if raw is None else (contract.verdict_value(raw) or INVALID)
    doc, problem = parse_report(annotations.get(contract.ANNOTATION_PROBE_REPORT))
    report = report_view(doc) if doc is not None else None
    if report is not None and report.labels.get(contract.LABEL_BACKEND) is None and verdict == UNPROBED:
        problem = None
    differ: tuple[str, ...] = ()
    if report is not None:
        own = (
            contract.LABEL_BACKEND,
            contract.LABEL_MULTICAST,
            contract.LABEL_MULTICAST_USABLE,
            contract.LABEL_MNNVL_WORKSPACE,
            *contract.RESULT_LABELS,
        )
        differ = tuple(k for k in own if labels.get(k) != report.labels.get(k) and (k in labels or k in report.labels))
    model = (report.models[0] if report and report.models else "") or clean(labels.get(GPU_PRODUCT), 60) or "unknown"
    gpus_raw = labels.get(contract.LABEL_GPUS)
    gpus = (
        gpus_raw
        if gpus_raw is not None and gpus_raw.isdigit() and len(gpus_raw) < 5
        else ("-" if gpus_raw is None else INVALID)
    )
    probe_time = parse_time(doc.get("probe_time")) if doc is not None else None
    cond = next(
        (
            c
            for c in _list(_dict(node.get("status")).get("conditions"))[:64]
            if isinstance(c, dict) and c.get("type") == contract.CONDITION_VERIFIED
        ),
        None,
    )
    expected = "True" if verdict in contract.BACKENDS else ("False" if verdict == contract.NO_BACKEND else "Unknown")
    return NodeView(
        name=name,
        verdict=verdict,
        model=model,
        gpus=gpus,
        multicast=_label(labels, contract.LABEL_MULTICAST_USABLE, contract.MULTICAST_USABLE_STATES)
        if contract.LABEL_MULTICAST_USABLE in labels
        else _label(labels, contract.LABEL_MULTICAST, contract.MULTICAST_STATES),
        results={b: _label(labels, contract.result_label(b), contract.TEST_RESULTS) for b in contract.BACKENDS},
        clique=clean(labels.get(contract.LABEL_CLIQUE) or labels.get(contract.LABEL_GFD_CLIQUE) or "-", 80),
        probe_time=probe_time,
        status=report.status or "-" if report is not None else "-",
        reason=_verdict_reason(verdict, report, problem, no_agent_arch(labels)),
        report_problem=problem if (doc is None and (verdict != UNPROBED or problem != "no probe report")) else None,
        condition=f"{clean(cond.get('status'), 10)} ({clean(cond.get('reason'), 40)})" if cond is not None else "-",
        condition_differs=cond is not None and cond.get("status") != expected,
        labels_differ=differ,
        report=report if keep_report else None,
    )


# -- pods --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerView:
    name: str
    reads: str
    """How the container gets the backend: ``annotation`` (fieldRef), ``own VALUE``, or ``none``."""
    started: str
    """``startedAt`` of the running container, or ``""``."""


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    node: str
    phase: str
    policy: str
    backend: str
    fusion: str
    reason: str
    node_verdict: str
    trigger: str
    decided_at: str
    previous: str
    decision_problem: str | None
    stale: bool
    containers: tuple[ContainerView, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


FUSION_WORDS: Final = {v: k for k, v in contract.FUSE_ALLREDUCE_RMS.items()}
"""``fiar.io/fuse-allreduce-rms`` as the container reads it: ``false`` is off, ``null`` on."""
TERMINAL_PHASES: Final = ("Succeeded", "Failed")


def parse_decision(raw: str | None) -> tuple[dict[str, Any] | None, str | None]:
    if raw is None:
        return None, "no fiar.io/decision annotation"
    if len(raw) > MAX_DECISION_CHARS:
        return None, f"fiar.io/decision of {len(raw)} characters, over the {MAX_DECISION_CHARS} read limit"
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None, "fiar.io/decision is not JSON"
    if not isinstance(doc, dict):
        return None, "fiar.io/decision is not a JSON object"
    return doc, None


def _container_views(pod: Mapping[str, Any]) -> tuple[ContainerView, ...]:
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    starts: dict[str, str] = {}
    for cs in _list(status.get("containerStatuses"))[:64]:
        cs = _dict(cs)
        running = _dict(_dict(cs.get("state")).get("running"))
        if isinstance(running.get("startedAt"), str) and isinstance(cs.get("name"), str):
            starts[cs["name"]] = running["startedAt"][:40]
    found = []
    containers = _list(spec.get("containers"))
    for c in containers[:64]:
        c = _dict(c)
        name: str = c["name"] if isinstance(c.get("name"), str) else "?"
        reads = "none"
        for env in _list(c.get("env")):
            env = _dict(env)
            if env.get("name") != contract.ENV_VAR:
                continue
            ref = _dict(_dict(env.get("valueFrom")).get("fieldRef")).get("fieldPath")
            if ref == f"metadata.annotations['{contract.ANNOTATION_POD_BACKEND}']":
                reads = "annotation"
            elif "value" in env:
                reads = f"own {clean(env.get('value'), 40)}"
            else:
                reads = "other"
        found.append(ContainerView(clean(name, 63), reads, clean(starts.get(name, ""), 40)))
    return tuple(found)


def pod_record(pod: Mapping[str, Any]) -> PodView:
    meta, spec, status = _dict(pod.get("metadata")), _dict(pod.get("spec")), _dict(pod.get("status"))
    labels, annotations = _str_map(meta.get("labels")), _str_map(meta.get("annotations"))
    decision, problem = parse_decision(annotations.get(contract.ANNOTATION_POD_DECISION))
    doc = decision or {}
    containers = _container_views(pod)
    stale = contract.runs_an_older_decision(decision, [c.started for c in containers if c.started])
    backend = annotations.get(contract.ANNOTATION_POD_BACKEND)
    fusion = annotations.get(contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS)
    node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else ""
    if decision is not None and node and doc.get("node") not in (None, node):
        problem = f"fiar.io/decision names node {clean(doc.get('node'), 63)!r}, the pod runs on {clean(node, 253)}"
    return PodView(
        namespace=clean(meta.get("namespace"), 63),
        name=clean(meta.get("name"), 253),
        node=clean(node, 253),
        phase=clean(status.get("phase") or "Pending", 20),
        policy=clean(labels.get(contract.LABEL_POD_POLICY, ""), 253),
        backend=(backend if backend in contract.ENV_VALUES else f"invalid {clean(backend, 40)!r}")
        if backend is not None
        else "-",
        fusion=FUSION_WORDS.get(fusion, f"invalid {clean(fusion, 20)!r}") if fusion is not None else "-",
        reason=clean(doc.get("reason") or "-", 40),
        node_verdict=clean(doc.get("nodeVerdict") or "-", 40),
        trigger=clean(doc.get("trigger") or "-", 20),
        decided_at=clean(doc.get("time") or "", 40),
        previous=clean(doc.get("previous") or "", 20),
        decision_problem=problem,
        stale=stale,
        containers=containers,
    )


# -- policies ----------------------------------------------------------------------------------------
POD_COUNTS: Final = (
    "decided",
    "fallback",
    "pending",
    "fusionOff",
    "stale",
    "unconfigured",
    "fusionUncontrolled",
    "multicastGuarded",
    "flashinferNotTurnedOff",
    "valuesNotApplied",
    "releaseNotQualified",
)
"""The policy status's pod counts, in the order shown; any other integer count (a newer operator's) follows."""
NODE_COUNTS: Final = (*contract.BACKEND_VERDICTS, UNPROBED, "verified")


@dataclass(frozen=True)
class PolicyView:
    name: str
    backends: tuple[str, ...]
    placement: str
    mode: str
    pods: Mapping[str, int]
    nodes: Mapping[str, int]
    ready: str
    conditions: tuple[tuple[str, str, str, str], ...]
    """(type, status, reason, message) of every condition."""


def _counts(raw: object, order: Sequence[str]) -> dict[str, int]:
    src = _dict(raw)
    ints = {clean(k, 40): v for k, v in list(src.items())[:32] if isinstance(v, int) and not isinstance(v, bool)}
    return {k: ints[k] for k in (*order, *sorted(set(ints) - set(order))) if k in ints}


def policy_record(obj: Mapping[str, Any]) -> PolicyView:
    meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
    conditions = []
    for c in _list(status.get("conditions"))[:16]:
        c = _dict(c)
        conditions.append(
            (
                clean(c.get("type"), 60),
                clean(c.get("status"), 10),
                clean(c.get("reason"), 60),
                clean(c.get("message"), 300),
            )
        )
    ready = next((s for t, s, _, _ in conditions if t == "Ready"), "-")
    backends = _list(spec.get("backends")) if "backends" in spec else list(contract.BACKENDS)
    return PolicyView(
        name=clean(meta.get("name"), 253),
        backends=tuple(clean(b, 20) for b in backends[:8]),
        placement=clean(spec.get("placement") or "Anywhere", 40),
        mode=clean(spec.get("mode") or "Enforce", 20),
        pods=_counts(status.get("pods"), POD_COUNTS),
        nodes=_counts(status.get("nodes"), NODE_COUNTS),
        ready=ready,
        conditions=tuple(conditions),
    )


# -- the fleet ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attention:
    kind: str
    """``stale-pod``, ``unconfigured``, ``uncontrolled``, ``decision``, ``probe-old``, ``probe-degraded``,
    ``report``, ``labels``, ``unprobed``, ``invalid``."""
    subject: str
    message: str


ATTENTION_ORDER: Final = (
    "stale-pod",
    "unconfigured",
    "decision",
    "uncontrolled",
    "invalid",
    "labels",
    "report",
    "probe-degraded",
    "probe-old",
    "unprobed",
)
"""What needs attention first: pods running what their node no longer verifies, then what the
operator could not configure, then nodes whose facts cannot be trusted, then old or missing probes."""


@dataclass(frozen=True)
class Fleet:
    now: float
    nodes: tuple[NodeView, ...]
    policies: tuple[PolicyView, ...]
    pods_seen: int
    attention: tuple[Attention, ...]
    stale_pods: tuple[str, ...] = ()
    skipped_nodes: int = 0
    """Nodes neither labelled by fiar nor GPU nodes (not shown)."""

    def groups(self) -> list[tuple[str, list[NodeView]]]:
        by: dict[str, list[NodeView]] = {}
        for n in self.nodes:
            by.setdefault(n.verdict, []).append(n)
        return [(v, sorted(by[v], key=lambda n: (n.model, n.clique, n.name))) for v in VERDICT_ORDER if v in by]

    def counts(self) -> dict[str, int]:
        return {v: len(ns) for v, ns in self.groups()}


def node_attention(node: NodeView, now: float, max_age_s: float) -> list[Attention]:
    found = []
    if node.verdict == INVALID:
        found.append(Attention("invalid", node.name, node.reason))
    if node.labels_differ:
        found.append(
            Attention(
                "labels",
                node.name,
                f"labels {', '.join(node.labels_differ)} differ from the probe report: written by someone else?",
            )
        )
    if node.condition_differs:
        found.append(
            Attention(
                "labels",
                node.name,
                f"condition {contract.CONDITION_VERIFIED} {node.condition} disagrees with verdict {node.verdict}",
            )
        )
    if node.report_problem is not None and node.report_problem != "no probe report":
        found.append(Attention("report", node.name, node.report_problem))
    elif node.report_problem == "no probe report":
        found.append(Attention("report", node.name, "labelled, but no probe report: written by someone else?"))
    if node.status == "degraded":
        found.append(Attention("probe-degraded", node.name, f"the last probe could not conclude: {node.reason}"))
    seconds = node.age_s(now)
    if seconds is not None and seconds > max_age_s:
        found.append(Attention("probe-old", node.name, f"last probe {age(seconds)} ago: is the agent running?"))
    if node.verdict == UNPROBED and node.report_problem is None:
        found.append(Attention("unprobed", node.name, node.reason))
    return found


def fleet(
    nodes: Iterable[NodeView | None],
    pods: Iterable[PodView],
    policies: Iterable[PolicyView],
    *,
    now: float,
    max_age_s: float = DEFAULT_PROBE_MAX_AGE_S,
    skipped_nodes: int = 0,
) -> Fleet:
    shown = tuple(sorted((n for n in nodes if n is not None), key=lambda n: n.name))
    attention: list[Attention] = []
    stale: list[str] = []
    seen = 0
    for pod in pods:
        seen += 1
        if pod.phase in TERMINAL_PHASES:
            continue
        if pod.stale:
            stale.append(pod.key)
            attention.append(
                Attention(
                    "stale-pod",
                    pod.key,
                    f"runs {pod.previous or 'an older value'} from before {pod.decided_at}; decided now: {pod.backend}"
                    f" (node {pod.node}, verdict {pod.node_verdict}): restart it to apply",
                )
            )
        if pod.policy and pod.node and pod.decision_problem is not None:
            attention.append(Attention("decision", pod.key, pod.decision_problem))
    shown_policies = tuple(sorted(policies, key=lambda p: p.name))
    for policy in shown_policies:
        for kind, count in (
            ("unconfigured", policy.pods.get("unconfigured", 0)),
            ("uncontrolled", policy.pods.get("fusionUncontrolled", 0)),
        ):
            if count > 0:
                what = (
                    "selected pods the pod webhook never configured: they run with vLLM's default until recreated"
                    if kind == "unconfigured"
                    else "pods whose vLLM command fiar cannot change: their fusion is not controlled"
                )
                message = next((m for t, s, _, m in policy.conditions if t == "UnconfiguredPods" and s == "True"), "")
                text = message if kind == "unconfigured" and message else f"{count} {what}"
                attention.append(Attention(kind, f"policy {policy.name}", text))
    for node in shown:
        attention.extend(node_attention(node, now, max_age_s))
    rank = {k: i for i, k in enumerate(ATTENTION_ORDER)}
    attention.sort(key=lambda a: (rank.get(a.kind, len(rank)), a.subject))
    return Fleet(now, shown, shown_policies, seen, tuple(attention), tuple(sorted(stale)), skipped_nodes)
