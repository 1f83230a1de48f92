"""Bounds on the work one AdmissionReview may cause: the pod's size, and a work budget for planning.

The API server accepts pods far larger than any inference pod: tens of thousands of containers,
labels or env entries, or one node-affinity expression of half a million values, fit in its 3 MiB
request limit, and a mutating webhook sees the object before the API server validates it (a dry
run costs the sender no quota). Planning such a pod against every policy and node would hold a
review thread for seconds and every other tenant's reviews behind it. Two bounds keep each review's
work small, whatever it holds:

- ``oversized``: counts of what planning reads (containers, labels, annotations, env entries,
  arguments, node-affinity expressions and their values, pod-affinity terms, resource claims, and
  the characters of those strings). Each bound is one to two orders of magnitude above the largest
  inference pod we know of (a LeaderWorkerSet vLLM or SGLang pod: a few containers, 10-40 labels
  and annotations, 20-100 env entries and arguments per container, a handful of affinity
  expressions); a pod past one is admitted unchanged, with a warning, and counting stops at the
  first bound passed (counts come from ``len`` before any list is walked).
- ``Budget``: planning spends it per node it evaluates (weighted by the requirements that node is
  checked against), and checks a deadline in the same loop; past either, ``OverBudget`` is raised
  and the review is answered unchanged, with a warning, so the thread is free again at once.

fiar configures no pod it cannot plan within bounded work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from fiar_operator.core.errors import NeedsThread, OverBudget

MAX_CONTAINERS: Final = 256
"""Containers and init containers of one pod (a vLLM pod has a handful)."""
MAX_LABELS: Final = 1_000
"""Labels of one pod (inference pods carry 10-40)."""
MAX_ANNOTATIONS: Final = 1_000
"""Annotations of one pod (10-40 in practice; the API server's 256 KiB limit is checked only after
the mutating webhooks ran)."""
MAX_AFFINITY_EXPRESSIONS: Final = 1_000
"""nodeSelector entries, required node-affinity terms and their expressions, counted together (a
pod has a handful; fiar's own placement adds two per term)."""
MAX_AFFINITY_VALUES: Final = 10_000
"""Values over all required node-affinity expressions. The largest real list names nodes one by one
(``kubernetes.io/hostname In [...]``): 10,000 covers every node of a 5,000-node cluster (the
largest Kubernetes supports) twice over. Planning reads them into sets, once per review."""
MAX_POD_AFFINITY_TERMS: Final = 1_000
"""Required pod-affinity terms (a group pod has one or two)."""
MAX_ENV_PER_CONTAINER: Final = 1_000
"""env and envFrom entries of one container (a vLLM container has 20-100)."""
MAX_ENV: Final = 4_000
"""env and envFrom entries over all containers: planning walks each container's list a few times
and copies it into the patch."""
MAX_ARGUMENTS: Final = 4_096
"""command and args entries over all containers (vLLM's command line: 20-100 tokens; fiar parses at
most ``commands.MAX_TOKENS`` per container)."""
MAX_CLAIMS: Final = 1_000
"""The pod's resourceClaims and its containers' resources.claims entries (a group pod has one)."""
MAX_CHARACTERS: Final = 1024 * 1024
"""Characters of the strings planning reads (label, annotation and env keys and values, command and
args, node selector and affinity keys and values). An inference pod has 5-50 KiB of them (a large
inline chat template included); the API server would refuse annotations over 256 KiB anyway."""

MAX_STEPS: Final = 200_000
"""Work one review may spend planning: one step per node evaluated, plus one per requirement (node
selector entry or affinity expression) it is checked against. A multi-pod group on a 5,000-node
cluster with five requirements costs 30,000; the whole budget takes 30-60 ms of one core."""


def _count(value: Any) -> int:
    return len(value) if isinstance(value, (list, Mapping)) else 0


def _map(value: Any, key: str) -> Mapping[str, Any]:
    found = value.get(key) if isinstance(value, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _list(value: Any, key: str) -> list[Any]:
    found = value.get(key) if isinstance(value, Mapping) else None
    return found if isinstance(found, list) else []


def _required_terms(spec: Mapping[str, Any]) -> list[Any]:
    required = _map(_map(_map(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution")
    return _list(required, "nodeSelectorTerms")


def _expressions(terms: list[Any]) -> list[Any]:
    return [e for t in terms for key in ("matchExpressions", "matchFields") for e in _list(t, key)]


def _chars(strings: Iterable[Any]) -> int:
    return sum(len(s) for s in strings if isinstance(s, str))


def _container_strings(container: Any) -> Iterable[Any]:
    yield from _list(container, "command")
    yield from _list(container, "args")
    for entry in _list(container, "env"):
        if isinstance(entry, Mapping):
            yield entry.get("name")
            yield entry.get("value")


def oversized(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is past the bounds fiar plans within, or None when it is not."""
    meta, spec = _map(pod, "metadata"), _map(pod, "spec")
    containers = [c for key in ("containers", "initContainers") for c in _list(spec, key)]
    counts: list[tuple[int, int, str]] = [
        (len(containers), MAX_CONTAINERS, "containers"),
        (_count(meta.get("labels")), MAX_LABELS, "labels"),
        (_count(meta.get("annotations")), MAX_ANNOTATIONS, "annotations"),
    ]
    for count, bound, what in counts:
        if count > bound:
            return f"{count} {what} (more than {bound})"
    env = [_count(c.get("env")) + _count(c.get("envFrom")) if isinstance(c, Mapping) else 0 for c in containers]
    if env and max(env) > MAX_ENV_PER_CONTAINER:
        return f"a container with {max(env)} env entries (more than {MAX_ENV_PER_CONTAINER})"
    terms = _required_terms(spec)
    expressions = _expressions(terms)
    claims = _count(spec.get("resourceClaims")) + sum(_count(_map(c, "resources").get("claims")) for c in containers)
    arguments = sum(_count(c.get("command")) + _count(c.get("args")) for c in containers if isinstance(c, Mapping))
    pod_affinity = _map(_map(spec, "affinity"), "podAffinity").get("requiredDuringSchedulingIgnoredDuringExecution")
    counts = [
        (sum(env), MAX_ENV, "env entries"),
        (arguments, MAX_ARGUMENTS, "command and args entries"),
        (
            _count(spec.get("nodeSelector")) + len(terms) + len(expressions),
            MAX_AFFINITY_EXPRESSIONS,
            "node-selector entries, node-affinity terms and expressions",
        ),
        (
            sum(_count(e.get("values")) for e in expressions if isinstance(e, Mapping)),
            MAX_AFFINITY_VALUES,
            "node-affinity values",
        ),
        (_count(pod_affinity), MAX_POD_AFFINITY_TERMS, "pod-affinity terms"),
        (claims, MAX_CLAIMS, "resource claims"),
    ]
    for count, bound, what in counts:
        if count > bound:
            return f"{count} {what} (more than {bound})"
    characters = _characters(meta, spec, containers, expressions)
    if characters > MAX_CHARACTERS:
        return f"{characters} characters of labels, annotations, env, commands, affinity (over {MAX_CHARACTERS})"
    return None


def _characters(meta: Mapping[str, Any], spec: Mapping[str, Any], containers: list[Any], expressions: list[Any]) -> int:
    """Characters of the strings planning reads; every list walked here was counted first."""
    total = 0
    for key in ("labels", "annotations"):
        pairs = _map(meta, key)
        total += _chars(pairs) + _chars(pairs.values())
    selector = _map(spec, "nodeSelector")
    total += _chars(selector) + _chars(selector.values())
    for expression in expressions:
        if isinstance(expression, Mapping):
            total += _chars([expression.get("key")]) + _chars(_list(expression, "values"))
    return total + sum(_chars(_container_strings(c)) for c in containers)


class Budget:
    """The work one review may still spend planning, and when it must stop: ``spend`` raises
    ``OverBudget`` past either. One review's budget is used by one thread at a time."""

    def __init__(
        self,
        steps: int | None = MAX_STEPS,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps, self.deadline, self.clock = steps, deadline, clock
        self.spent = 0

    @classmethod
    def within(cls, seconds: float, steps: int | None = MAX_STEPS) -> Budget:
        """A budget of ``steps`` that also ends ``seconds`` from now."""
        return cls(steps, time.monotonic() + seconds)

    def spend(self, steps: int = 1) -> None:
        self.spent += steps
        if self.steps is not None and self.spent > self.steps:
            raise OverBudget(f"planning passed its budget of {self.steps} node and requirement checks")
        if self.deadline is not None and self.clock() > self.deadline:
            raise OverBudget(f"planning passed its deadline after {self.spent} node and requirement checks")


class OnLoop(Budget):
    """The budget of a review answered on the webhook server's event loop: no planning step at all.
    The first raises ``NeedsThread``, and the review goes to a review thread: the loop serves every
    connection, so it runs only what is bounded without a deadline (a single pod's binding looks up
    its pod and its node, a single pod's CREATE plans its patch; a group's walks the candidate nodes,
    spending a step for each)."""

    def __init__(self) -> None:
        super().__init__(0, None)

    def spend(self, steps: int = 1) -> None:
        raise NeedsThread("planning needs a review thread")


def unbounded() -> Budget:
    """A budget that never runs out (the reconciler's, which runs on its own loop)."""
    return Budget(None, None)
