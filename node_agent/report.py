"""The probe report: the JSON document behind the ``fiar.io/probe-report`` annotation.

Schema ``fiar.io/probe-report``, version 1. Top-level keys:

``schema``, ``version``      identify the format; readers ignore reports of other versions
``agent``                    agent version
``node``                     the Node it was written to (daemon only)
``hardware``                 ``nvml`` or ``simulated (... host <fixture>)``
``probe_time``               RFC 3339 UTC time the probe started; ``duration_s`` its length
``status``                   ``ok`` or ``degraded``
``labels``                   exactly the labels written (or, from ``fiar-agent probe``, that would be)
``reasons``                  why, in sentences, one per finding
``versions``                 agent, driver, CUDA driver, NVML, torch, FlashInfer (and NCCL from the test)
``inventory``                GPU summary (count, models, NVLink, P2P, fabric, multicast attribute)
``fingerprint``              driver + GPU UUIDs: a result is reused only while it is unchanged
``policy``                   host policy: whether multicast is forbidden and by what
``tests``                    per backend: result, kind, reason, step seconds (``jit`` apart from the
                             test), numerics, latency, benchmark points, the child's policy env
``benchmark``                per passing backend: geometric-mean ratio to NCCL and the margin
``config``                   the probe options that shape results (timeout, ranks, benchmark)
``labels_kept_from``         only when no smoke test was conclusive and the verdict labels of an
                             earlier report (same fingerprint and host policy) were kept: the
                             ``probe_time`` of the probe that concluded them (carried over
                             through consecutive inconclusive probes)

The annotation is kept compact (no whitespace) and well under Kubernetes' 256 KiB budget for all
annotations of an object. Reading one back (``parse``) never raises: an annotation that is too
large, not JSON, nested too deeply, of another version or of the wrong shape is no report. The
agent reads an earlier report once, into a ``PreviousReport`` (``PreviousReport.parse``): the
document is a dict only here, where JSON is written and read.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import fiar_contract as contract
from node_agent import __version__, inventory
from node_agent.inventory import Inventory
from node_agent.policy import HostPolicy
from node_agent.smoke.outcome import SHARED_GPU_MARK, SmokeOutcome
from node_agent.verdict import HARDWARE_LABELS, VERDICT_LABELS, PreviousVerdict, Verdict

SCHEMA = contract.PROBE_REPORT_SCHEMA
VERSION = contract.PROBE_REPORT_VERSION
MAX_BYTES = 64 * 1024
MAX_READ_BYTES = contract.PROBE_REPORT_MAX_READ_CHARS
"""A longer annotation is not read at all (the API server's budget for all annotations of an object)."""

_ALLOWED_VALUES: dict[str, tuple[str, ...]] = {
    contract.LABEL_BACKEND: contract.BACKEND_VERDICTS,
    contract.LABEL_MULTICAST: contract.MULTICAST_STATES,
    contract.LABEL_MULTICAST_USABLE: contract.MULTICAST_USABLE_STATES,
    contract.LABEL_MNNVL_WORKSPACE: contract.MNNVL_WORKSPACE_STATES,
    **dict.fromkeys(contract.RESULT_LABELS, contract.TEST_RESULTS),
}


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(
    *,
    hardware: str,
    started_at: float,
    duration_s: float,
    inv: Inventory | None,
    inventory_error: str | None,
    policy: HostPolicy,
    tests: Mapping[contract.Backend, SmokeOutcome],
    verdict: Verdict,
    software: Mapping[str, str | None],
    config: Mapping[str, Any],
    node: str | None = None,
) -> dict[str, Any]:
    versions: dict[str, Any] = {
        "agent": __version__,
        "driver": inv.driver_version if inv else None,
        "cuda_driver": inv.cuda_driver_str if inv else None,
        "nvml": inv.nvml_version if inv else None,
        "torch": software.get("torch"),
        "flashinfer": software.get("flashinfer"),
    }
    for outcome in tests.values():  # what the child actually imported beats package metadata
        for key in ("torch", "flashinfer", "nccl", "cuda_runtime"):
            if outcome.measured.versions.get(key):
                versions[key] = outcome.measured.versions[key]
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "version": VERSION,
        "agent": __version__,
        "node": node,
        "hardware": hardware,
        "probe_time": rfc3339(started_at),
        "duration_s": round(duration_s, 3),
        "status": verdict.status,
        "labels": dict(verdict.labels),
        "reasons": list(verdict.reasons),
        "versions": versions,
        "inventory": inventory.summary(inv) if inv is not None else {"error": inventory_error},
        "fingerprint": inv.fingerprint() if inv is not None else None,
        "policy": policy.to_dict(),
        "tests": {name: tests[name].to_dict() for name in contract.BACKENDS},
        "benchmark": {name: j.to_dict() for name, j in verdict.bench.items()},
        "config": dict(config),
    }
    if verdict.kept_from is not None:
        report["labels_kept_from"] = verdict.kept_from
    if verdict.shared_gpu:
        report["shared_gpu"] = SHARED_GPU_MARK
    return report


def dumps(report: Mapping[str, Any]) -> str:
    """Compact JSON for the annotation; drops benchmark points first if it would be too large."""
    text = json.dumps(report, separators=(",", ":"), default=str)
    if len(text.encode()) <= MAX_BYTES:
        return text
    slim = json.loads(text)
    for test in slim.get("tests", {}).values():
        test.pop("bench", None)
    slim.setdefault("reasons", []).append("benchmark points dropped from the annotation (size)")
    return json.dumps(slim, separators=(",", ":"), default=str)


def parse(text: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None), or (None, why it is not one); never raises, whatever the text (the contract's reading,
    the same ``kubectl fiar`` does)."""
    return contract.parse_probe_report(text)


def loads(text: str | None) -> dict[str, Any] | None:
    """A report of this schema and version, or None (absent, garbage, other version, too large)."""
    return parse(text)[0]


_UNREADABLE_TEST = (ValueError, KeyError, TypeError, AttributeError, ArithmeticError)
"""What ``SmokeOutcome.from_dict`` raises for a hostile entry (``int(1e999)`` is an OverflowError)."""


@dataclass(frozen=True)
class PreviousReport:
    """What the agent reads back from an earlier report: parsed once (``PreviousReport.parse``) from
    the Node's annotation, or taken from the agent's own last probe (``probe.ProbeResult.as_previous``).

    ``tests`` holds the entries that could be read (one that does not parse, or whose step times or
    latencies are not numbers, is left out); ``labels`` the label
    values that are strings; ``multicast_forbidden`` is None when the report's host policy is not a
    boolean (such a report matches no host policy)."""

    probe_time: str
    fingerprint: str | None
    labels: Mapping[str, str]
    multicast_forbidden: bool | None
    tests: Mapping[contract.Backend, SmokeOutcome]
    labels_kept_from: str | None = None

    @property
    def has_verdict(self) -> bool:
        """Whether the report wrote ``fiar.io/backend``."""
        return contract.LABEL_BACKEND in self.labels

    @classmethod
    def parse(cls, text: str | None) -> tuple[PreviousReport | None, str | None]:
        """(report, None), or (None, why it is not one); never raises, whatever the text."""
        doc, why = parse(text)
        if doc is None:
            return None, why
        probe_time = doc.get("probe_time")
        if not isinstance(probe_time, str) or not probe_time:
            return None, "no probe_time"
        policy = doc.get("policy") or {}
        forbidden = policy.get("multicast_forbidden")
        kept_from = doc.get("labels_kept_from")
        return (
            cls(
                probe_time=probe_time,
                fingerprint=doc.get("fingerprint") or None,
                labels={k: v for k, v in (doc.get("labels") or {}).items() if isinstance(v, str)},
                multicast_forbidden=forbidden if isinstance(forbidden, bool) else None,
                tests=_read_tests(doc.get("tests") or {}),
                labels_kept_from=kept_from if isinstance(kept_from, str) and kept_from else None,
            ),
            None,
        )


def _read_tests(raw: Mapping[str, Any]) -> dict[contract.Backend, SmokeOutcome]:
    found: dict[contract.Backend, SmokeOutcome] = {}
    for name in contract.BACKENDS:
        entry = raw.get(name)
        if not isinstance(entry, dict):
            continue
        try:
            outcome = SmokeOutcome.from_dict(name, entry)
        except _UNREADABLE_TEST:
            continue
        if all(
            isinstance(v, (int, float))
            for v in (*outcome.measured.steps.values(), *outcome.measured.latency_us.values())
        ):
            found[name] = outcome  # step times and latencies are numbers wherever they are read
    return found


def reusable_tests(previous: PreviousReport | None, fingerprint: str) -> dict[contract.Backend, SmokeOutcome]:
    """Conclusive test results of an earlier report for the same driver and GPUs."""
    if previous is None or previous.fingerprint != fingerprint:
        return {}
    return {
        name: replace(outcome, reused_from=outcome.reused_from or previous.probe_time)
        for name, outcome in previous.tests.items()
        if outcome.result in ("pass", "fail") and not outcome.degraded
    }


def _allowed(key: str, value: str) -> bool:
    if key == contract.LABEL_FLASHINFER:
        return contract.flashinfer_value(value) is not None
    return value in _ALLOWED_VALUES.get(key, ())


def previous_verdict(
    previous: PreviousReport | None, fingerprint: str | None, multicast_forbidden: bool
) -> PreviousVerdict | None:
    """The verdict labels of an earlier report for the same driver, GPUs and host policy, if it wrote one.

    ``fingerprint`` None: the GPUs cannot be read now (NVML missing or failing, a driver mid-upgrade).
    Nothing says the hardware changed, so a report of the same host policy is taken, with its
    ``HARDWARE_LABELS``; a driver or GPU change shows once the GPUs read again."""
    if previous is None or not previous.fingerprint:
        return None
    if fingerprint is not None and previous.fingerprint != fingerprint:
        return None
    if previous.multicast_forbidden is not multicast_forbidden:
        return None
    labels = previous.labels
    kept = {k: labels[k] for k in VERDICT_LABELS if k in labels}
    if contract.LABEL_BACKEND not in kept or not all(_allowed(k, v) for k, v in kept.items()):
        return None
    # labels kept by an inconclusive probe still date from the probe that concluded them
    when = previous.labels_kept_from or previous.probe_time
    hardware = {k: labels[k] for k in HARDWARE_LABELS if k in labels}
    if contract.compute_capability_value(hardware.get(contract.LABEL_COMPUTE_CAPABILITY)) is None:
        hardware.pop(contract.LABEL_COMPUTE_CAPABILITY, None)
    return PreviousVerdict(labels=kept, probe_time=when, hardware=hardware)
