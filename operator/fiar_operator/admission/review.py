"""The webhooks as plain functions: AdmissionReview in, AdmissionReview out. Two mutating ones (pod
CREATE, binding) and one validating one on policies, which allows every policy and first hands it to
``on_policy`` (the webhooks' conditions are made to cover it before it is stored).

Both answer from the in-memory ``Store``. When an answer needs an object the store does not hold
(a brand-new namespace's labels, or a pod this replica neither admitted nor has seen yet), the
handler returns a ``Need``; the server fetches it with a bounded read and calls again with it.

A malformed AdmissionReview raises ``ReviewError`` (HTTP 400). Anything else that goes wrong is
answered ``allowed: true`` without a patch: the webhooks never block a pod or its scheduling.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.admission import mutation
from fiar_operator.core import decide, limits, patches
from fiar_operator.core.decide import utc_now
from fiar_operator.core.errors import OverBudget, PolicyError, ReviewError
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.names import is_namespace_name, is_object, is_pod_name
from fiar_operator.core.pods import PodRecord, group_plan, pod_options, pod_record, vllm_release
from fiar_operator.core.policy import NAMESPACE_NAME_LABEL, Policy, covers_namespace, parse_policy, select_policy
from fiar_operator.state.store import Store

log = logging.getLogger(__name__)

REVIEW_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_WARNINGS: Final = 8
MAX_WARNING_LENGTH: Final = 120
"""Kubernetes asks admission warnings to stay under 120 characters."""


@dataclass(frozen=True)
class Need:
    """An object the answer depends on that the store does not hold: ``kind`` is pod or namespace."""

    kind: str
    namespace: str
    name: str = ""


@dataclass(frozen=True)
class Review:
    api_version: str
    request: Mapping[str, Any]

    @property
    def uid(self) -> str:
        return str(self.request["uid"])

    @property
    def dry_run(self) -> bool:
        return bool(self.request.get("dryRun"))


def parse_review(body: bytes) -> Review:
    """Check the envelope of an AdmissionReview; ReviewError says what is wrong with it."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReviewError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise ReviewError("the body nests JSON too deeply") from None
    if not isinstance(doc, dict):
        raise ReviewError("an AdmissionReview must be a JSON object")
    if doc.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be AdmissionReview, not {doc.get('kind')!r}")
    if doc.get("apiVersion") not in REVIEW_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(REVIEW_VERSIONS)}, not {doc.get('apiVersion')!r}")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise ReviewError("the AdmissionReview has no request object")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError("request.uid is missing")
    return Review(str(doc["apiVersion"]), request)


def respond(review: Review, ops: list[patches.Op] | None = None, warnings: list[str] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": review.uid, "allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = patches.encode(ops)
    if warnings:
        response["warnings"] = [f"fiar: {w}"[:MAX_WARNING_LENGTH] for w in warnings[:MAX_WARNINGS]]
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


class Admission:
    """The webhooks' logic over a Store; ``clock`` gives decision times (RFC 3339)."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        clock: Callable[[], str] = utc_now,
        on_policy: Callable[[Policy], None] | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.on_policy = on_policy
        """Called with each policy being created or changed (not on a dry run), before the answer."""

    # -- helpers ---------------------------------------------------------------------------------
    def _namespace_labels(self, namespace: str, fetched: Mapping[str, Any] | None) -> dict[str, str] | None:
        labels = self.store.namespaces.get(namespace)
        if labels is None and is_object(fetched, "Namespace", namespace):
            assert fetched is not None
            self.store.put_namespace(fetched)
            labels = self.store.namespaces.get(namespace)
        return labels

    # -- pod CREATE ------------------------------------------------------------------------------
    def pod_create(
        self,
        review: Review,
        fetched: Mapping[str, Any] | None = None,
        can_read: bool = True,
        budget: limits.Budget | None = None,
    ) -> dict[str, Any] | Need:
        """The pod CREATE answer; ``fetched`` is the namespace read after a ``Need`` (None: the read
        failed). Planning spends ``budget`` (None: a fresh ``limits.Budget``); past it the pod is
        allowed unchanged with a warning."""
        try:
            return self._pod_create(review, fetched, can_read, budget if budget is not None else limits.Budget())
        except OverBudget as exc:
            return self._over_budget(review, "pods", exc)

    def _over_budget(self, review: Review, webhook: str, exc: OverBudget) -> dict[str, Any]:
        request = review.request
        obj = request.get("object")
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = (meta.get("name") or meta.get("generateName") or "") if isinstance(meta, Mapping) else ""
        log.warning(
            "%s webhook: pod %s/%r allowed unchanged: %s",
            webhook,
            str(request.get("namespace") or "")[:63],
            str(request.get("name") or name)[:80],
            exc,
        )
        self.metrics.admission(webhook, "over_budget")
        return respond(review, warnings=[f"pod not configured: {exc}"])

    def _pod_create(
        self, review: Review, fetched: Mapping[str, Any] | None, can_read: bool, budget: limits.Budget
    ) -> dict[str, Any] | Need:
        request = review.request
        pod = request.get("object")
        if (
            request.get("operation") != "CREATE"
            or request.get("subResource")
            or not isinstance(pod, dict)
            or not isinstance(pod.get("metadata"), dict)
            or not isinstance(pod.get("spec"), dict)
        ):
            self.metrics.admission("pods", "ignored")
            return respond(review)
        meta = pod["metadata"]
        namespace = str(request.get("namespace") or meta.get("namespace") or "")
        if namespace and not is_namespace_name(namespace):
            # The API server never sends this: a forged review. Nothing is read or remembered.
            self.metrics.admission("pods", "ignored")
            return respond(review)
        too_large = limits.oversized(pod)
        if too_large is not None:
            log.warning(
                "pod %s/%r admitted unchanged: %s",
                namespace,
                str(meta.get("name") or meta.get("generateName") or "")[:80],
                too_large,
            )
            self.metrics.admission("pods", "oversized")
            return respond(review, warnings=[f"pod not configured: {too_large}"])
        labels = meta.get("labels")
        pod_labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        policies = list(self.store.policies.values())
        if not policies or not namespace:
            return self._unmanaged(review, pod, "unmanaged")
        ns_labels = self._namespace_labels(namespace, fetched)
        if ns_labels is None:
            candidates = [p for p in policies if p.pod_selector.matches(pod_labels)]
            if any(not p.namespace_selector.empty for p in candidates):
                if can_read:
                    return Need("namespace", namespace)
                # A selector with NotIn or DoesNotExist could exclude this namespace: take no pod.
                if not review.dry_run:
                    record = dataclasses.replace(pod_record(pod), namespace=namespace, policy=None)
                    self.store.remember(record)
                warning = f"labels of namespace {namespace} unknown; no policy applied"
                return self._unmanaged(review, pod, "namespace_unknown", [warning])
            ns_labels = {NAMESPACE_NAME_LABEL: namespace}
        if contract.NAMESPACE_IGNORE_LABEL in ns_labels:
            self.metrics.admission("pods", "unmanaged")
            return respond(review)
        if not covers_namespace(policies, ns_labels):
            return self._unmanaged(review, pod, "unmanaged")
        plan = mutation.plan_pod_create(pod, select_policy(policies, ns_labels, pod_labels), self.store.nodes, budget)
        if not review.dry_run:
            record = plan.record if plan.record is not None else pod_record(plan.pod, commands=False)
            if not record.namespace:
                record = dataclasses.replace(record, namespace=namespace)
            record = dataclasses.replace(record, policy=plan.policy.name if plan.managed and plan.policy else None)
            self.store.remember(record)
        if plan.decision is not None:
            self.metrics.decision(plan.decision)
        if plan.managed:
            self.metrics.admission("pods", "mutated" if plan.ops else "unchanged")
            return respond(review, plan.ops, plan.warnings)
        return self._unmanaged(review, plan.pod, "unmanaged", plan.warnings)

    def _unmanaged(
        self, review: Review, pod: Mapping[str, Any], result: str, warnings: list[str] | None = None
    ) -> dict[str, Any]:
        """The answer for a pod no policy changes: only the backend default its containers may need."""
        ops = mutation.default_backend_ops(pod)
        warnings = list(warnings or [])
        if ops:
            warnings.append(f"no policy sets {contract.ANNOTATION_POD_BACKEND}, which the pod reads: set to auto")
            if result == "unmanaged":
                result = "defaulted"
        self.metrics.admission("pods", result)
        return respond(review, ops, warnings)

    # -- FiAllreducePolicy CREATE and UPDATE (validating) -----------------------------------------
    def policy(
        self,
        review: Review,
        fetched: Mapping[str, Any] | None = None,
        can_read: bool = True,
        budget: limits.Budget | None = None,
    ) -> dict[str, Any]:
        """Always allowed: the CRD's schema validates a policy, and status reports what it cannot use.
        A policy fiar can use is first handed to ``on_policy`` (not on a dry run); a failure there is
        logged, never a refusal."""
        request = review.request
        obj = request.get("object")
        if review.dry_run or self.on_policy is None or request.get("operation") not in ("CREATE", "UPDATE"):
            return respond(review)
        if not isinstance(obj, Mapping) or obj.get("kind") != contract.KIND:
            return respond(review)
        try:
            parsed = parse_policy(obj)
        except PolicyError:
            return respond(review)
        self.metrics.admission("policies", "allowed")
        self.on_policy(parsed)
        return respond(review)

    # -- pods/binding CREATE ---------------------------------------------------------------------
    def _find_pod(
        self, namespace: str, name: str, uid: str, fetched: Mapping[str, Any] | None
    ) -> tuple[PodRecord | None, str]:
        record = self.store.pods.get((namespace, name))
        if record is not None and (not uid or not record.uid or record.uid == uid):
            return record, "index"
        memo = self.store.recall(namespace, name)
        if memo is not None:
            return memo, "memo"
        if is_object(fetched, "Pod", name, namespace):
            assert fetched is not None
            found = self.store.put_pod(fetched)
            if not uid or found.uid == uid:
                return found, "read"
        return None, "unknown"

    def binding(
        self,
        review: Review,
        fetched: Mapping[str, Any] | None = None,
        can_read: bool = True,
        budget: limits.Budget | None = None,
    ) -> dict[str, Any] | Need:
        """The pods/binding CREATE answer; planning spends ``budget`` as in ``pod_create``."""
        try:
            return self._binding(review, fetched, can_read, budget if budget is not None else limits.Budget())
        except OverBudget as exc:
            return self._over_budget(review, "binding", exc)

    def _binding(
        self, review: Review, fetched: Mapping[str, Any] | None, can_read: bool, budget: limits.Budget
    ) -> dict[str, Any] | Need:
        request = review.request
        binding = request.get("object")
        if (
            request.get("subResource") != "binding"
            or request.get("operation") != "CREATE"
            or not isinstance(binding, dict)
        ):
            self.metrics.admission("binding", "ignored")
            return respond(review)
        meta = binding.get("metadata") or {}
        target = (binding.get("target") or {}).get("name")
        namespace = str(request.get("namespace") or meta.get("namespace") or "")
        name = str(request.get("name") or meta.get("name") or "")
        if not isinstance(target, str) or not target or not is_namespace_name(namespace) or not is_pod_name(name):
            self.metrics.admission("binding", "ignored")
            return respond(review)
        policies = list(self.store.policies.values())
        ns_labels = self.store.namespaces.get(namespace)
        if not policies or (
            ns_labels is not None
            and (contract.NAMESPACE_IGNORE_LABEL in ns_labels or not covers_namespace(policies, ns_labels))
        ):
            self.metrics.lookup("uncovered")
            self.metrics.admission("binding", "unmanaged")
            return respond(review)
        record, source = self._find_pod(namespace, name, str(meta.get("uid") or ""), fetched)
        if record is None and can_read:
            return Need("pod", namespace, name)
        # A memo entry's policy is the one this webhook chose at CREATE; a pod read or indexed carries the
        # label its writer gave it, which counts only where that policy selects the pod.
        policy = None
        if record is not None and record.policy:
            policy = self.store.policies.get(record.policy) if source == "memo" else self.store.policy_of(record)
        if record is None or policy is None:
            self.metrics.lookup(source)
            self.metrics.admission("binding", "unmanaged")
            return respond(review)
        decision = decide.decide(
            policy,
            target,
            self.store.nodes.get(target),
            group_plan(record, policy),
            self.store.nodes,
            trigger="binding",
            time=self.clock(),
            budget=budget,
            release=vllm_release(record, policy),
            options=pod_options(record, policy),
        )
        self.metrics.lookup(source)  # after planning: a review that moves to a thread is counted once
        ops = patches.set_map_entries(binding, ("metadata", "annotations"), decision.annotations())
        self.metrics.decision(decision)
        self.metrics.admission("binding", "mutated")
        return respond(review, ops)
