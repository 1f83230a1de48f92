"""The MutatingWebhookConfiguration of the two webhooks, and the ValidatingWebhookConfiguration of
the policy webhook: the one place of their settings.

``fiar-operator webhook-config``, ``fiar-operator run --register-webhooks`` (the local demo) and the
Helm chart render the same webhooks; a test renders the chart and compares it with this module.
Both webhooks fail open (failurePolicy Ignore): an operator outage leaves pods on their fallback
backend and never blocks creation or scheduling. Both share one short timeout, the API server's
minimum of 1 s: each answers from memory (docs/operator.md, "How long the API server waits").
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import fiar_contract as contract
from fiar_operator.core.pods import INJECTED, field_path
from fiar_operator.core.policy import Policy
from fiar_operator.core.selectors import LabelSelector, Requirement
from fiar_operator.core.settings import ALWAYS_EXCLUDED

NAME: Final = "fiar-operator"
POD_HOOK: Final = f"pods.{contract.GROUP}"
BINDING_HOOK: Final = f"binding.{contract.GROUP}"
POD_PATH: Final = "/mutate/pods"
BINDING_PATH: Final = "/mutate/binding"
POLICY_HOOK: Final = f"policies.{contract.GROUP}"
POLICY_PATH: Final = "/validate/policies"
POLICY_SIDE_EFFECTS: Final = "NoneOnDryRun"
"""The policy webhook patches the pod webhooks' conditions before it allows a policy; never on a dry run."""
TIMEOUT_SECONDS: Final = 1
"""API-server timeout of each webhook call; the chart's ``operator.webhook.timeoutSeconds`` default.
The API server's minimum: a hung operator delays a managed pod's CREATE, and its binding, by this
much each. The handler answers far below it (p99 in milliseconds at 20 concurrent creators), and the
server's own deadline (``server.WORK_DEADLINE``) answers a stuck review before it."""
MAX_TIMEOUT_SECONDS: Final = 2
"""Longest timeout allowed (the chart's values schema says the same): a slow call delays a binding."""
FAILURE_POLICY: Final = "Ignore"
SIDE_EFFECTS: Final = "None"
MATCH_POLICY: Final = "Equivalent"


@dataclass(frozen=True)
class Hook:
    name: str
    path: str
    resource: str
    reinvocation: Literal["IfNeeded", "Never"]
    """IfNeeded on the pod hook: a container that a later webhook adds is selected too."""


HOOKS: Final = (
    Hook(POD_HOOK, POD_PATH, "pods", "IfNeeded"),
    Hook(BINDING_HOOK, BINDING_PATH, "pods/binding", "Never"),
)


def namespace_selector(
    exclude: Sequence[str] = ALWAYS_EXCLUDED, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Namespaces the webhooks see: not excluded, not labelled fiar.io/ignore, and matching ``extra``."""
    expressions: list[dict[str, Any]] = []
    if exclude:
        names = list(dict.fromkeys(exclude))
        expressions.append({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": names})
    expressions.append({"key": contract.NAMESPACE_IGNORE_LABEL, "operator": "DoesNotExist"})
    selector: dict[str, Any] = {"matchExpressions": expressions + list((extra or {}).get("matchExpressions") or [])}
    if (extra or {}).get("matchLabels"):
        selector["matchLabels"] = dict((extra or {})["matchLabels"])
    return selector


def configuration(
    ca_bundle: bytes,
    *,
    url: str | None = None,
    service: tuple[str, str, int] | None = None,
    name: str = NAME,
    selector: Mapping[str, Any] | None = None,
    timeout: int = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The configuration, pointing at ``url`` (https://host:port) or ``service`` (namespace, name, port)."""
    _check_target(url, service, timeout)
    ns_selector = dict(selector) if selector is not None else namespace_selector()

    def client_config(path: str) -> dict[str, Any]:
        return _client_config(ca_bundle, url, service, path)

    def webhook(hook: Hook) -> dict[str, Any]:
        return {
            "name": hook.name,
            "clientConfig": client_config(hook.path),
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": [hook.resource],
                    "scope": "Namespaced",
                }
            ],
            "admissionReviewVersions": ["v1"],
            "sideEffects": SIDE_EFFECTS,
            "failurePolicy": FAILURE_POLICY,
            "matchPolicy": MATCH_POLICY,
            "reinvocationPolicy": hook.reinvocation,
            "timeoutSeconds": timeout,
            "namespaceSelector": ns_selector,
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fiar"}},
        "webhooks": [webhook(hook) for hook in HOOKS],
    }


def policy_configuration(
    ca_bundle: bytes,
    *,
    url: str | None = None,
    service: tuple[str, str, int] | None = None,
    name: str = NAME,
    timeout: int = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The policy webhook's configuration (validating, fails open, allows every policy): before a
    policy is stored the operator makes the pod webhooks' conditions cover it, so that pods created
    right after it (one apply of a policy and its workload) reach them."""
    _check_target(url, service, timeout)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fiar"}},
        "webhooks": [
            {
                "name": POLICY_HOOK,
                "clientConfig": _client_config(ca_bundle, url, service, POLICY_PATH),
                "rules": [
                    {
                        "apiGroups": [contract.GROUP],
                        "apiVersions": [contract.VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [contract.PLURAL],
                        "scope": "Cluster",
                    }
                ],
                "admissionReviewVersions": ["v1"],
                "sideEffects": POLICY_SIDE_EFFECTS,
                "failurePolicy": FAILURE_POLICY,
                "matchPolicy": MATCH_POLICY,
                "timeoutSeconds": timeout,
            }
        ],
    }


def _check_target(url: str | None, service: tuple[str, str, int] | None, timeout: int) -> None:
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    if not 1 <= timeout <= MAX_TIMEOUT_SECONDS:
        raise ValueError(f"webhook timeout {timeout}s: expected 1 to {MAX_TIMEOUT_SECONDS}")


def _client_config(
    ca_bundle: bytes, url: str | None, service: tuple[str, str, int] | None, path: str
) -> dict[str, Any]:
    bundle = base64.b64encode(ca_bundle).decode()
    if url is not None:
        return {"url": url.rstrip("/") + path, "caBundle": bundle}
    assert service is not None
    return {
        "service": {"namespace": service[0], "name": service[1], "port": service[2], "path": path},
        "caBundle": bundle,
    }


# -- matchConditions in step with the policies ---------------------------------------------------
CONDITION: Final = "fiar-policies"
"""The name of the one matchCondition the operator keeps on each webhook (the chart sets none)."""
NAME_LABEL: Final = "kubernetes.io/metadata.name"
LABELS: Final = "object.metadata.labels"
HAS_LABELS: Final = "has(object.metadata.labels)"


MAX_CONDITION_CHARS: Final = 256 * 1024
"""Longest pod or binding condition the operator sends. The API server bounds a condition by its
estimated CEL cost, not by length; this bound keeps a request that would be refused anyway (and
the operator's own memory) small. Past it, or when the API server refuses the conditions, the
webhooks fall back to the chart's static configuration (``STATIC``)."""
STATIC: Final = "true"
"""The condition of the static configuration: every pod the chart's rules send reaches the webhook."""


def cel_string(value: str) -> str:
    """``value`` as a CEL string literal, for every string a policy can hold.

    JSON's escapes are not all CEL's: a character outside the Basic Multilingual Plane is a
    surrogate pair in JSON (``\\ud83d\\ude00``), which CEL refuses ("invalid unicode code point").
    Quotes, backslashes and control characters are escaped; a non-BMP character is written
    ``\\UXXXXXXXX``; a lone surrogate (no Unicode scalar value: the API server never stores one)
    becomes U+FFFD, as Go's JSON decoder makes it."""
    out = ['"']
    for char in value:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code > 0xFFFF:
            out.append(f"\\U{code:08x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


_lit = cel_string


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_lit(v) for v in values) + "]"


def _label_term(req: Requirement) -> str:
    present = f"({HAS_LABELS} && {_lit(req.key)} in {LABELS})"
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return f"!{present}"
    within = f"{LABELS}[{_lit(req.key)}] in {_list(req.values)}"
    if req.operator == "In":
        return f"({present} && {within})"
    return f"(!{present} || !({within}))"  # NotIn


def pod_selector_cel(selector: LabelSelector) -> str:
    """CEL over the pod's labels that is true exactly when ``selector`` matches them."""
    reqs = [Requirement(k, "In", (v,)) for k, v in selector.match_labels] + list(selector.expressions)
    return " && ".join(_label_term(r) for r in reqs) if reqs else "true"


def namespace_cel(selector: LabelSelector) -> str:
    """CEL over ``request.namespace`` that is true whenever ``selector`` can match the namespace: its
    terms on the namespace's name are kept, terms on other labels (which a matchCondition cannot
    read) count as true, so the condition is never narrower than the selector."""
    reqs = [Requirement(k, "In", (v,)) for k, v in selector.match_labels] + list(selector.expressions)
    terms = []
    for req in reqs:
        if req.key != NAME_LABEL or req.operator == "Exists":
            continue
        if req.operator == "DoesNotExist":
            return "false"
        within = f"request.namespace in {_list(req.values)}"
        terms.append(within if req.operator == "In" else f"!({within})")
    return " && ".join(terms) if terms else "true"


def names_only(selector: LabelSelector) -> tuple[str, ...] | None:
    """The namespaces ``selector`` can match when it names them (an In or matchLabels term on the
    namespace name); None when it may match namespaces by other labels."""
    reqs = [Requirement(k, "In", (v,)) for k, v in selector.match_labels] + list(selector.expressions)
    named = [set(r.values) for r in reqs if r.key == NAME_LABEL and r.operator == "In"]
    if not named:
        return None
    return tuple(sorted(set.intersection(*named)))


READS_FIAR: Final = " || ".join(
    f"(has(object.spec.{key}) && object.spec.{key}.exists(c, has(c.env) && c.env.exists(e, "
    f"has(e.valueFrom) && has(e.valueFrom.fieldRef) && e.valueFrom.fieldRef.fieldPath in "
    f"{_list(sorted(field_path(a) for a in INJECTED.values()))})))"
    for key in ("containers", "initContainers")
)
"""A container reads one of fiar's annotations (it gets vLLM's default when no policy takes it)."""
LABELLED: Final = f"({HAS_LABELS} && {_lit(contract.LABEL_POD_POLICY)} in {LABELS})"


def pod_condition(policies: Iterable[Policy]) -> str:
    """The pod webhook's condition: a policy can select the pod, or the pod already carries fiar's
    policy label, or a container reads fiar's annotations. In that order: CEL stops at the first
    true clause, so a pod a policy selects (the pods the webhook is for) skips the walk over every
    container's env."""
    clauses = [policy_clause(policy) for policy in sorted(policies, key=lambda p: p.name)]
    return " || ".join([*clauses, LABELLED, READS_FIAR])


def policy_clause(policy: Policy) -> str:
    """The pod condition's clause of one policy: it can select the pod."""
    return f"(({namespace_cel(policy.namespace_selector)}) && ({pod_selector_cel(policy.pod_selector)}))"


def binding_condition(policies: Iterable[Policy], managed_namespaces: Iterable[str]) -> str:
    """The binding webhook's condition. A Binding carries none of the pod's labels, so only the
    namespace can narrow it: the namespaces policies name, and those that hold managed pods."""
    names = set(managed_namespaces)
    for policy in policies:
        named = names_only(policy.namespace_selector)
        if named is None:
            return "true"
        names.update(named)
    return f"request.namespace in {_list(sorted(names))}"


def match_conditions(policies: Iterable[Policy], managed_namespaces: Iterable[str]) -> dict[str, list[dict[str, str]]]:
    """Hook name -> the matchConditions the operator sets, from the valid policies."""
    policies = list(policies)
    return {
        POD_HOOK: [{"name": CONDITION, "expression": pod_condition(policies)}],
        BINDING_HOOK: [{"name": CONDITION, "expression": binding_condition(policies, managed_namespaces)}],
    }
