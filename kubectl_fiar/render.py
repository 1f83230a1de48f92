"""View model to text and JSON: what ``kubectl fiar`` prints. Pure functions, no I/O.

Tables follow kubectl's layout (upper-case headers, columns separated by three spaces, ``-`` for
nothing, ages as ``45s``/``12m``/``5h``/``3d``). Colour only where the caller says the output is a
terminal (``Style``); JSON never has any.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import fiar_contract as contract
from kubectl_fiar import model
from kubectl_fiar.model import INVALID, UNPROBED, Fleet, NodeView, PodView, PolicyView, ReportView, age

API_VERSION: Final = "kubectl-fiar.fiar.io/v1"
REASON_WIDTH: Final = 100
"""Characters of a node's reason in the default table (``-o wide``: all of it)."""

_COLOURS: Final = {"mnnvl": "32", "trtllm": "32", "none": "33", UNPROBED: "90", INVALID: "31", "attention": "31;1"}


@dataclass(frozen=True)
class Style:
    colour: bool = False
    wide: bool = False

    def paint(self, text: str, key: str) -> str:
        code = _COLOURS.get(key)
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


VERDICT_WORDS: Final = {
    "mnnvl": "mnnvl verified",
    "trtllm": "trtllm verified",
    "none": "no backend verified",
    UNPROBED: "not probed",
    INVALID: "invalid verdict label",
}


# -- status ------------------------------------------------------------------------------------------
def _short(text: str, style: Style) -> str:
    return text if style.wide or len(text) <= REASON_WIDTH else text[: REASON_WIDTH - 1] + "…"


def node_rows(nodes: Sequence[NodeView], now: float, style: Style) -> list[list[str]]:
    head = ["NODE", "GPU MODEL", "GPUS", "MULTICAST", *(b.upper() for b in contract.BACKENDS), "CLIQUE", "PROBED"]
    if style.wide:
        head.append("REPORT")
    rows = [[*head, "REASON"]]
    for n in nodes:
        row = [n.name, n.model, n.gpus, n.multicast, *(n.results[b] for b in contract.BACKENDS), n.clique]
        row.append(age(n.age_s(now)))
        if style.wide:
            row.append(n.status)
        rows.append([*row, _short(n.reason, style)])
    return rows


def policy_rows(policies: Sequence[PolicyView]) -> list[list[str]]:
    extra = sorted({k for p in policies for k in p.pods} - set(model.POD_COUNTS))
    counts = [*model.POD_COUNTS, *extra]
    head = ["NAME", "BACKENDS", "PLACEMENT", "MODE", *(_header(k) for k in counts), "READY"]
    rows = [head]
    for p in policies:
        rows.append(
            [
                p.name,
                ",".join(p.backends) or "-",
                p.placement,
                p.mode,
                *(str(p.pods.get(k, "-")) for k in counts),
                p.ready,
            ]
        )
    return rows


def _header(key: str) -> str:
    headers = {
        "fusionOff": "FUSION-OFF",
        "fusionUncontrolled": "UNCONTROLLED",
        "multicastGuarded": "GUARDED",
        "flashinferNotTurnedOff": "FI-PATHS-ON",
        "valuesNotApplied": "NOT-APPLIED",
        "releaseNotQualified": "UNQUALIFIED",
    }
    return headers.get(key, key.upper())


def status_text(f: Fleet, style: Style, scope: str) -> str:
    counts = f.counts()
    total = sum(counts.values())
    summary = ", ".join(f"{style.paint(v, v)} {c}" for v, c in counts.items()) or "none"
    out = [f"{total} GPU nodes: {summary}"]
    if not f.nodes:
        out.append("No GPU node and no node labelled by fiar (is the agent DaemonSet installed?).")
    for verdict, nodes in f.groups():
        out += ["", style.paint(f"{verdict.upper()}: {VERDICT_WORDS[verdict]} ({len(nodes)})", verdict)]
        out.append(table(node_rows(nodes, f.now, style)))
    out.append("")
    if f.policies:
        out += [
            "POLICIES (pods as each policy's status counts them, in all namespaces)",
            table(policy_rows(f.policies)),
        ]
    else:
        out.append("No FiAllreducePolicy: no pod is managed by fiar.")
    out.append("")
    if f.attention:
        out.append(style.paint(f"NEEDS ATTENTION ({len(f.attention)}, most urgent first)", "attention"))
        rows = [["WHAT", "WHERE", "WHY"]] + [[a.kind, a.subject, a.message] for a in f.attention]
        out.append(table(rows))
    else:
        out.append(
            "Nothing needs attention: every probe is recent and conclusive, every managed pod runs its decision."
        )
    out.append(f"(managed pods read: {f.pods_seen}, {scope}; nodes without GPUs, not shown: {f.skipped_nodes})")
    out.append("")
    out.append("Why a node got its verdict: kubectl fiar why NODE; what a pod got: kubectl fiar why pod NAMESPACE/NAME")
    return "\n".join(out) + "\n"


_SNAKE = re.compile(r"[a-z]+(?:_[a-z]+)+")


def _key(name: str) -> str:
    """A field name as the JSON key (camelCase, as Kubernetes spells them); label keys stay as they are."""
    if not _SNAKE.fullmatch(name):
        return name
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    return value


def node_json(n: NodeView, now: float) -> dict[str, Any]:
    doc: dict[str, Any] = _plain(asdict(n))
    doc["probeAgeSeconds"] = None if n.probe_time is None else round(now - n.probe_time, 1)
    if n.report is None:
        doc.pop("report")
    return doc


def status_json(f: Fleet, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "FleetStatus",
        "scope": scope,
        "counts": f.counts(),
        "nodes": [node_json(n, f.now) for n in f.nodes],
        "policies": [_plain(asdict(p)) for p in f.policies],
        "managedPodsRead": f.pods_seen,
        "stalePods": list(f.stale_pods),
        "attention": [_plain(asdict(a)) for a in f.attention],
    }


# -- why NODE ----------------------------------------------------------------------------------------
def meaning(n: NodeView) -> str:
    """What the node's verdict means for the pods scheduled on it (docs/operator.md)."""
    if n.verdict in contract.BACKENDS:
        return (
            f"Pods of a policy that allows {n.verdict} get {contract.ENV_VAR}={n.verdict} with vLLM's FlashInfer "
            "allreduce fusion on (reason Verified). A policy that does not allow it gets the first of its backends "
            "this node also verifies, else its fallbackBackend with the fusion off."
        )
    if n.verdict == contract.NO_BACKEND:
        trt = n.results.get("trtllm") == "pass"
        runs = "trtllm (its trtllm test passed, so it runs)" if trt else "their policy's fallbackBackend"
        return (
            f"No backend is verified: pods here run with vLLM's FlashInfer allreduce fusion off (reason NotVerified), "
            f"with {contract.ENV_VAR}={runs}. Policies with placement VerifiedNodesOnly keep their pods off this node."
        )
    what = (
        "has no verdict"
        if n.verdict == UNPROBED
        else "has a verdict label that is not one of fiar's (read as none at all)"
    )
    return (
        f"The node {what}: pods here get their policy's fallbackBackend with the fusion off (reason NotProbed). "
        "Policies with placement VerifiedNodesOnly keep their pods off this node."
    )


def _tested(t: model.TestView) -> str:
    head = t.result
    parts = [t.kind] if t.kind and t.kind not in ("ok", t.result) else []
    if t.ranks:
        parts.append(f"on {t.ranks} GPUs")
    if t.seconds is not None:
        parts.append(f"{t.seconds:.1f} s")
    if t.vs_nccl is not None:
        rec = "" if t.recommended is None else (", recommended" if t.recommended else ", not recommended")
        parts.append(f"{t.vs_nccl:.2f}x NCCL's latency{rec}")
    if t.reused_from:
        parts.append(f"result reused from the probe of {t.reused_from}")
    if t.degraded:
        parts.append("inconclusive")
    text = head + (f" ({'; '.join(parts)})" if parts else "")
    return f"{text}: {t.reason}" if t.reason else text


def _read_lines(r: ReportView) -> list[tuple[str, str]]:
    cc = f" (compute {', '.join(r.compute_capability)})" if r.compute_capability else ""
    gpus = f"{r.gpus if r.gpus is not None else '?'}x {', '.join(r.models) or 'unknown model'}{cc}"
    if r.inventory_error:
        gpus = f"could not be read: {r.inventory_error}"
    soft = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("driver", r.driver),
            ("CUDA driver", r.cuda_driver),
            ("torch", r.torch),
            ("FlashInfer", r.flashinfer),
            ("NCCL", r.nccl),
        )
        if v
    )
    nvswitch = {True: "yes", False: "no", None: "-"}[r.nvswitch]
    link = f"peer-to-peer over NVLink: {r.p2p_nvlink or '-'}; NVSwitch: {nvswitch}; fabric: {r.fabric or '-'}"
    policy = (
        f"multicast forbidden by {', '.join(r.multicast_forbidden_by)}"
        if r.multicast_forbidden_by
        else "multicast allowed"
    )
    return [
        ("GPUs", gpus),
        ("Software", soft or "-"),
        ("NVLink", link),
        ("Multicast", f"device attribute reads {r.multicast_attribute or '-'}"),
        ("Host policy", policy),
    ]


def why_node_text(n: NodeView, pods: Sequence[PodView], now: float, style: Style) -> str:
    out = [f"Node {n.name}: {style.paint(n.verdict, n.verdict)} ({VERDICT_WORDS[n.verdict]})"]
    labels = ", ".join(f"{b} {n.results[b]}" for b in contract.BACKENDS)
    out.append(f"Labels: multicast {n.multicast}, {labels}, GPUs {n.gpus}, clique {n.clique}")
    out.append(f"Condition {contract.CONDITION_VERIFIED}: {n.condition}")
    r = n.report
    if r is None:
        out.append(f"Probe report: {n.report_problem or 'none'}")
    else:
        took = f", took {r.duration_s:.1f} s" if r.duration_s is not None else ""
        out.append(
            f"Probed {age(n.age_s(now))} ago ({r.probe_time or '?'}{took}), status {r.status or '?'}, "
            f"agent {r.agent or '?'}, hardware {r.hardware or '?'}"
        )
        if r.kept_from:
            out.append(f"That probe could not conclude: the verdict labels are kept from the probe of {r.kept_from}.")
        out += ["", "What was read"]
        out += [f"  {k + ':':<13}{v}" for k, v in _read_lines(r)]
        out += ["", "Which tests ran"]
        if r.tests:
            width = max(len(t.backend) for t in r.tests)
            out += [f"  {t.backend:<{width}}  {_tested(t)}" for t in r.tests]
        else:
            out.append("  none (the report lists no smoke test)")
        out += ["", "Why"]
        out += [f"  - {reason}" for reason in r.reasons] or ["  (no reason given)"]
    if n.labels_differ:
        out.append(f"Note: labels {', '.join(n.labels_differ)} differ from the probe report: someone else wrote them.")
    out += ["", "What this means for pods", f"  {meaning(n)}"]
    out += ["", f"Managed pods on this node ({len(pods)})"]
    if pods:
        rows = [["POD", "POLICY", "BACKEND", "FUSION", "REASON", "RUNS IT"]]
        rows += [
            [p.key, p.policy or "-", p.backend, p.fusion, p.reason, "no: restart" if p.stale else "yes"] for p in pods
        ]
        out.append(table(rows))
    return "\n".join(out) + "\n"


# -- why pod -----------------------------------------------------------------------------------------
REASON_WORDS: Final = {
    "Verified": "its node verified this backend",
    "NotVerified": "its node verifies none of the policy's backends",
    "NotProbed": "its node has no verdict (never probed by the fiar agent)",
    "NodeUnknown": "its node was not known to the operator when it was bound",
    "Pending": "not bound to a node yet: decided when the scheduler binds it",
    "MultiNodeNeedsMnnvl": "a multi-pod group needs mnnvl, which the policy does not allow",
    "MultiNodeNoSharedClique": "not every node of its multi-pod group verifies mnnvl in one NVLink clique",
    "MultiNodeNoImexChannel": "its multi-pod group carries no IMEX channel claim, which mnnvl across pods needs",
}


def _container_line(c: model.ContainerView, p: PodView) -> str:
    if c.reads == "annotation":
        if not c.started:
            return f"reads fiar.io/backend; not running now (gets {p.backend} when it starts)"
        if p.stale:
            return (
                f"started {c.started}, before its backend changed from {p.previous or '?'} to {p.backend} at "
                f"{p.decided_at}: still runs with {p.previous or 'the old value'} until it restarts"
            )
        return f"started {c.started}: runs with {p.backend}"
    if c.reads.startswith("own "):
        return f"sets {contract.ENV_VAR} itself ({c.reads[4:]}): fiar leaves it"
    if c.reads == "other":
        return f"takes {contract.ENV_VAR} from somewhere fiar does not manage"
    return f"does not read {contract.ENV_VAR}: vLLM's default (auto)"


def why_pod_text(p: PodView, node: NodeView | None, policy: PolicyView | None, now: float, style: Style) -> str:
    out = [f"Pod {p.key} ({p.phase}) on node {p.node or '- (not bound)'}"]
    if not p.policy:
        out.append(
            "Not managed by fiar: it carries no fiar.io/policy label (no policy selected it when it was created,"
            " or the pod webhook was unavailable then). It runs with vLLM's default (auto)."
        )
    else:
        got = f"{contract.ENV_VAR}={p.backend}, fusion {p.fusion}"
        out.append(f"Got:       {got}")
        if p.decision_problem is not None:
            out.append(f"Decision:  unreadable: {p.decision_problem}")
        else:
            when = f"{p.decided_at} " if p.decided_at else ""
            out.append(f"Why:       {p.reason}: {REASON_WORDS.get(p.reason, 'a reason this version does not know')}")
            out.append(f"Decided:   {when}(at {p.trigger}), when the node's verdict was {p.node_verdict}")
        if policy is None:
            out.append(f"Policy:    {p.policy} (no such FiAllreducePolicy now)")
        else:
            out.append(
                f"Policy:    {policy.name}: backends {','.join(policy.backends)}, placement {policy.placement}, "
                f"mode {policy.mode}"
            )
    if node is not None:
        results = ", ".join(f"{b} {node.results[b]}" for b in contract.BACKENDS)
        out.append(
            f"Node now:  {style.paint(node.verdict, node.verdict)} ({results}, multicast {node.multicast}), "
            f"probed {age(node.age_s(now))} ago"
        )
        if p.policy and p.decision_problem is None and p.node_verdict not in ("-", node.verdict):
            out.append("           the verdict changed since the decision: the operator re-annotates the pod")
    elif p.node:
        out.append("Node now:  not a GPU node fiar knows (no fiar.io/ labels)")
    out += ["", "Containers"]
    if p.containers:
        width = max(len(c.name) for c in p.containers)
        out += [f"  {c.name:<{width}}  {_container_line(c, p)}" for c in p.containers]
    else:
        out.append("  none readable")
    if p.stale:
        out += ["", style.paint("Restart the pod (or its containers) so that they read the new backend.", "attention")]
    return "\n".join(out) + "\n"


def why_pod_json(p: PodView, node: NodeView | None, policy: PolicyView | None, now: float) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "PodExplanation",
        "pod": _plain(asdict(p)),
        "node": node_json(node, now) if node is not None else None,
        "policy": _plain(asdict(policy)) if policy is not None else None,
        "runsItsDecision": bool(p.policy) and not p.stale and p.decision_problem is None,
    }


def why_node_json(n: NodeView, pods: Sequence[PodView], now: float) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeExplanation",
        "node": node_json(n, now),
        "meaning": meaning(n),
        "pods": [_plain(asdict(p)) for p in pods],
    }


def counts_line(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())
