"""The verdict as a node condition: where admins and their tools already look for node health.

``FiarAllreduceVerified`` (``fiar_contract.CONDITION_VERIFIED``) mirrors the verdict labels the
same publish writes, so the two never disagree:

====================  ========  =====================  =====================================
``fiar.io/backend``    status    reason                 message
====================  ========  =====================  =====================================
a backend              True      ``BackendVerified``    the verdict's sentence from the report
``none``               False     ``NoBackendVerified``  why no backend passed
absent                 Unknown   ``NotConcluded``       why the probe could not conclude
====================  ========  =====================  =====================================

``lastTransitionTime`` changes only when the status does; ``lastHeartbeatTime`` is the time of
the publish. Pure: the publisher writes the result through ``nodes/status``, which the chart's
admission policy lets the agent change for exactly this condition of its own Node.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import fiar_contract as contract

MAX_MESSAGE: Final = 300
"""Characters of the message (one line): the chart's admission policy allows at most 1024."""
REASONS: Final = {"True": "BackendVerified", "False": "NoBackendVerified", "Unknown": "NotConcluded"}


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reasons(report_text: str) -> tuple[list[str], str | None]:
    try:
        doc = json.loads(report_text)
    except ValueError:
        return [], None
    if not isinstance(doc, dict):
        return [], None
    raw = doc.get("reasons")
    reasons = [r for r in raw if isinstance(r, str)] if isinstance(raw, list) else []
    kept = doc.get("labels_kept_from")
    return reasons, kept if isinstance(kept, str) else None


def _message(verdict: str | None, reasons: Sequence[str], kept_from: str | None) -> str:
    picked = None
    for prefix in (f"backend {verdict}", f"{verdict} "):
        picked = picked or next((r for r in reasons if verdict and r.startswith(prefix)), None)
    text = picked or (reasons[-1] if reasons else "")
    if verdict in contract.BACKENDS:
        text = f"{verdict} verified: {text}" if text else f"{verdict} verified"
    elif verdict is None:
        text = f"no verdict: {text}" if text else "no verdict: the probe could not conclude"
    if kept_from:
        text += f" (verdict kept from the probe of {kept_from}; the last probe could not conclude)"
    return one_line(text)


def condition(
    labels: Mapping[str, str], report_text: str, now: float, previous: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The condition for the labels just written and their report; ``previous``: the Node's current one."""
    verdict = contract.verdict_value(labels.get(contract.LABEL_BACKEND))
    status = "True" if verdict in contract.BACKENDS else ("False" if verdict == contract.NO_BACKEND else "Unknown")
    reasons, kept_from = _reasons(report_text)
    stamp = rfc3339(now)
    transition = stamp
    if (
        previous is not None
        and previous.get("status") == status
        and isinstance(previous.get("lastTransitionTime"), str)
    ):
        transition = previous["lastTransitionTime"]
    return {
        "type": contract.CONDITION_VERIFIED,
        "status": status,
        "reason": REASONS[status],
        "message": _message(verdict, reasons, kept_from),
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": transition,
    }


def current(conditions: object) -> Mapping[str, Any] | None:
    """The Node's ``FiarAllreduceVerified`` condition, if it has one."""
    if not isinstance(conditions, list):
        return None
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == contract.CONDITION_VERIFIED), None)
