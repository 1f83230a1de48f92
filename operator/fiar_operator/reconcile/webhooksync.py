"""Keeps the webhook configuration's matchConditions in step with the policies (the leader only).

The chart installs the MutatingWebhookConfiguration without conditions: every pod CREATE and
binding outside the excluded namespaces reaches the webhooks, which is correct while no operator
has narrowed it. The leading replica then sets one matchCondition per webhook (webhookconfig.py
writes them), so the API server itself skips the pods no policy can select, and does not wait on
the operator for them, not even when it hangs. It patches only the configuration it is named
(``--webhook-config``) and only those conditions, and only when they change; the chart's
admission policy refuses it any other change of that configuration.

A policy is covered before it is stored: the operator's validating webhook on policies
(``admit``) widens the conditions for it while the API server admits it, so the pods of a policy
applied together with its workload (one ``kubectl apply -f dir/``) reach the webhooks although the
leader's watch has not brought the policy yet. The leader narrows them to the policies plus the
ones admitted in the last ``ADMITTED_FOR`` seconds (a superset is always safe); another replica
sets the static conditions when the new policy is not covered, and the leader narrows them when
its watch brings the policy.

Conditions the API server cannot hold (past CEL's cost limit: many or large policies) are never
left stale: the operator falls back to the static configuration (``webhookconfig.STATIC``, every
pod the chart's rules send reaches the webhooks), says so once in a Warning event and in the
metric ``fiar_webhook_conditions_follow_policies``, and tries the narrowed conditions again when
the policies change.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from fiar_operator.core.errors import ApiError, Invalid
from fiar_operator.core.policy import Policy
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state.kube import MUTATING_CONFIGS, Kube

log = logging.getLogger(__name__)

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
RETRY: Final = 5.0
"""Seconds before a failed patch is tried again (e.g. the configuration is installed after the start)."""
ADMITTED_FOR: Final = 10.0
"""Seconds a policy admitted by the policy webhook counts for the conditions whether or not the
leader's watch holds it yet (on the control plane here the watch brings it within 30-70 ms)."""
PATCH_TIMEOUT: Final = 10.0
"""Seconds the reconciler's patch of the conditions may take."""
ADMIT_TIMEOUT: Final = 1.0
"""Seconds the policy webhook's patch may take: it holds a review thread, and the API server waits for
the answer at most the webhook's timeout (1-2 s); past it the policy is allowed, and the leader's
watch covers it as before."""
MAX_ADMITTED: Final = 64
"""Policy admissions that may change the conditions within ``ADMITTED_FOR`` seconds: the webhook port
is unauthenticated, so forged reviews must not make the operator patch without end or hold clauses
without bound; past it an admission is allowed and the leader's watch covers the policy as before."""

Conditions = dict[str, list[dict[str, str]]]


def static_conditions() -> Conditions:
    """The conditions of the static configuration: each webhook sees every request its rules name."""
    return {
        hook.name: [{"name": webhookconfig.CONDITION, "expression": webhookconfig.STATIC}]
        for hook in webhookconfig.HOOKS
    }


@dataclass(frozen=True)
class Fallback:
    """The narrowed conditions could not be set; the static ones are in force."""

    reason: str


class WebhookSync:
    def __init__(self, kube: Kube, name: str | None) -> None:
        self.kube, self.name = kube, name
        self._applied: Conditions | None = None
        self._wanted: Conditions | None = None
        """The narrowed conditions last asked for (refused ones included: not asked again unchanged)."""
        self._retry_at: float | None = None
        self.binding_namespaces: frozenset[str] | None = None
        """The namespaces the binding condition names (None: it names none, every one passes)."""
        self.fallback: Fallback | None = None
        """Set while the static conditions stand in for conditions the API server refused."""
        self.fallbacks: list[Fallback] = []
        """Fallbacks not yet reported (the reconciler takes them for its event)."""
        self._admitted: dict[str, tuple[float, Policy]] = {}
        """Policies the policy webhook admitted: name -> (until when they count, the policy)."""
        self._admissions: collections.deque[float] = collections.deque()
        """When each admission of the last ``ADMITTED_FOR`` seconds was taken (at most ``MAX_ADMITTED``)."""
        self._lock = threading.Lock()
        """One patch at a time: the reconciler's thread and the policy webhook's review threads."""
        self.clock = time.monotonic

    def admit(
        self, policy: Policy, policies: Iterable[Policy], managed_namespaces: Iterable[str], leading: bool
    ) -> str:
        """A policy is being created or changed (its admission review, before it is stored): make the
        conditions cover it now. The leader narrows them to ``policies`` and it; another replica sets
        the static conditions if ``policies`` alone do not cover it. What was done, for the log."""
        if not self.name:
            return "no configuration to follow the policies"
        policies, namespaces = list(policies), list(managed_namespaces)
        with self._lock:
            now = self.clock()
            while self._admissions and self._admissions[0] <= now - ADMITTED_FOR:
                self._admissions.popleft()
            if len(self._admissions) >= MAX_ADMITTED:
                return f"not widened: {MAX_ADMITTED} policies admitted in the last {ADMITTED_FOR:g} s"
            self._admissions.append(now)
            self._admitted[policy.name] = (now + ADMITTED_FOR, policy)
            if leading:
                return "narrowed" if self._sync(policies, namespaces, ADMIT_TIMEOUT) else "covered"
            namespaces = sorted(set(namespaces))
            before = webhookconfig.match_conditions(policies, namespaces)
            replaced = [p for p in policies if p.name != policy.name] + [policy]
            if webhookconfig.match_conditions(replaced, namespaces) == before:
                return "covered"
            try:
                self._patch(static_conditions(), ADMIT_TIMEOUT)
            except ApiError as exc:
                log.warning("webhook configuration %s not widened for policy %s: %s", self.name, policy.name, exc)
                return "not widened"
            return "widened"

    def sync(self, policies: Iterable[Policy], managed_namespaces: Iterable[str]) -> bool:
        """Patch the conditions if they changed since the last patch; whether a patch was sent."""
        if not self.name:
            return False
        with self._lock:
            return self._sync(list(policies), list(managed_namespaces))

    def _sync(self, policies: list[Policy], managed_namespaces: list[str], timeout: float = PATCH_TIMEOUT) -> bool:
        policies = self._with_admitted(policies)
        namespaces = sorted(set(managed_namespaces))
        wanted = webhookconfig.match_conditions(policies, namespaces)
        if wanted == self._wanted and self._retry_at is None:
            return False
        longest = max(len(c["expression"]) for conditions in wanted.values() for c in conditions)
        if longest > webhookconfig.MAX_CONDITION_CHARS:
            return self._fall_back(
                wanted, f"a condition of {longest} characters (more than {webhookconfig.MAX_CONDITION_CHARS})", timeout
            )
        try:
            self._patch(wanted, timeout)
        except Invalid as exc:
            return self._fall_back(wanted, f"the API server refused the conditions: {str(exc)[:300]}", timeout)
        except ApiError as exc:
            self._failed(exc)
            return False
        self._wanted, self._applied, self._retry_at = wanted, wanted, None
        if self.fallback is not None:
            log.info("webhook configuration %s follows the policies again", self.name)
        self.fallback = None
        expression = wanted[webhookconfig.BINDING_HOOK][0]["expression"]
        self.binding_namespaces = None if expression == "true" else frozenset(namespaces) | _named(policies)
        log.info("webhook configuration %s follows %d policies", self.name, len(policies))
        return True

    def _patch(self, conditions: Conditions, timeout: float) -> None:
        body = {"webhooks": [{"name": hook, "matchConditions": c} for hook, c in conditions.items()]}
        self.kube.call(
            "PATCH", f"{MUTATING_CONFIGS}/{self.name}", body=body, content_type=STRATEGIC_MERGE, timeout=timeout
        )

    def _failed(self, exc: ApiError) -> None:
        if self._retry_at is None:
            log.warning("webhook configuration %s not narrowed to the policies: %s", self.name, exc)
        self._retry_at = time.monotonic() + RETRY

    def _fall_back(self, wanted: Conditions, reason: str, timeout: float = PATCH_TIMEOUT) -> bool:
        """Set the static conditions in place of ``wanted``; whether a patch was sent."""
        self._wanted = wanted
        static = static_conditions()
        if self._applied != static:
            try:
                self._patch(static, timeout)
            except ApiError as exc:
                self._failed(exc)
                self._wanted = None  # try the whole sync again
                return False
        self._applied, self._retry_at, self.binding_namespaces = static, None, None
        if self.fallback is None:
            log.warning(
                "webhook configuration %s falls back to its static conditions (every pod reaches the webhooks): %s",
                self.name,
                reason,
            )
            self.fallbacks.append(Fallback(reason))
        self.fallback = Fallback(reason)
        return True

    def take_fallbacks(self) -> list[Fallback]:
        found, self.fallbacks = self.fallbacks, []
        return found

    def due(self) -> bool:
        """Whether a failed patch should be tried again now, or an admitted policy stopped counting."""
        now = self.clock()
        return (self._retry_at is not None and now >= self._retry_at) or any(
            until <= now for until, _ in list(self._admitted.values())
        )

    def _with_admitted(self, policies: list[Policy]) -> list[Policy]:
        """``policies`` and the ones admitted lately that they do not hold as admitted (a new policy,
        or a changed one beside its old version: the union covers both)."""
        now = self.clock()
        for name, (until, _) in list(self._admitted.items()):
            if until <= now:
                del self._admitted[name]
        held = [dataclasses.replace(p, generation=0) for p in policies]
        return policies + [p for _, p in self._admitted.values() if dataclasses.replace(p, generation=0) not in held]

    def forget(self) -> None:
        """Patch again at the next ``sync`` (after leadership changed hands)."""
        self._applied = None
        self._wanted = None


def _named(policies: Iterable[Policy]) -> frozenset[str]:
    names: set[str] = set()
    for policy in policies:
        names.update(webhookconfig.names_only(policy.namespace_selector) or ())
    return frozenset(names)
