"""Label selectors (namespaces, pods) and node-selector terms (node affinity), evaluated in memory.

Semantics follow Kubernetes: an empty LabelSelector matches everything; ``In``/``NotIn`` need
values, ``Exists``/``DoesNotExist`` must have none; a node matches a list of node-selector terms
when it matches any term, and a term when it matches all of its expressions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fiar_operator.core.errors import PolicyError

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NODE_OPERATORS = (*LABEL_OPERATORS, "Gt", "Lt")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()
    members: frozenset[str] = field(init=False, repr=False, compare=False)
    """``values`` as a set, built once: ``In``/``NotIn`` cost one lookup per node, however many values."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", frozenset(self.values))

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.members
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.members
        if self.operator in ("Gt", "Lt") and present and len(self.values) == 1:
            try:
                have, bound = int(labels[self.key]), int(self.values[0])
            except ValueError:
                return False
            return have > bound if self.operator == "Gt" else have < bound
        return False


@dataclass(frozen=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.expressions)


EVERYTHING = LabelSelector()


def parse_requirement(raw: Any, where: str, operators: tuple[str, ...] = LABEL_OPERATORS) -> Requirement:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: must be an object with key, operator and values")
    key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
    if not isinstance(key, str) or not key:
        raise PolicyError(f"{where}.key: must be a non-empty string")
    if operator not in operators:
        raise PolicyError(f"{where}.operator: {operator!r} is not one of {', '.join(operators)}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise PolicyError(f"{where}.values: must be a list of strings")
    if operator in ("In", "NotIn") and not values:
        raise PolicyError(f"{where}.values: operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise PolicyError(f"{where}.values: operator {operator} takes no values")
    if operator in ("Gt", "Lt") and len(values) != 1:
        raise PolicyError(f"{where}.values: operator {operator} takes exactly one integer value")
    return Requirement(key, str(operator), tuple(values))


def parse_label_selector(raw: Any, where: str) -> LabelSelector:
    """Parse a LabelSelector object; ``None`` and ``{}`` select everything."""
    if raw is None:
        return EVERYTHING
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: must be a LabelSelector object (matchLabels, matchExpressions)")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise PolicyError(f"{where}.matchLabels: must map label keys to string values")
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise PolicyError(f"{where}.matchExpressions: must be a list")
    return LabelSelector(
        tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        tuple(parse_requirement(e, f"{where}.matchExpressions[{i}]") for i, e in enumerate(exprs)),
    )


@dataclass(frozen=True)
class NodeConstraint:
    """Where a pod may be scheduled, as far as node labels say: nodeSelector AND (any required term)."""

    node_selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Requirement, ...], ...] = ()

    @property
    def cost(self) -> int:
        """Work of one ``admits`` call at most: one step per node, plus one per requirement."""
        return 1 + len(self.node_selector) + sum(len(term) for term in self.terms)

    def admits(self, node_labels: Mapping[str, str]) -> bool:
        for key, value in self.node_selector:
            if node_labels.get(key) != value:
                return False
        if not self.terms:
            return True
        for term in self.terms:  # plain loops: this runs once per node and term of a group's check
            for req in term:
                if not req.matches(node_labels):
                    break
            else:
                return True
        return False


ANYWHERE = NodeConstraint()


def node_constraint(spec: Mapping[str, Any]) -> NodeConstraint:
    """The label part of a pod spec's placement (nodeSelector + required node affinity).

    Field-based terms (``matchFields``) are ignored: they only name nodes, which a label index
    cannot rule out, so the result may admit more nodes than the scheduler would (never fewer).
    """
    selector = spec.get("nodeSelector") or {}
    pairs = tuple(sorted((str(k), str(v)) for k, v in selector.items())) if isinstance(selector, Mapping) else ()
    terms: list[tuple[Requirement, ...]] = []
    for term in _required_terms(spec):
        reqs = []
        for i, expr in enumerate(term.get("matchExpressions") or []):
            try:
                reqs.append(parse_requirement(expr, f"nodeSelectorTerms[].matchExpressions[{i}]", NODE_OPERATORS))
            except PolicyError:
                continue
        terms.append(tuple(reqs))
    return NodeConstraint(pairs, tuple(terms)) if pairs or terms else ANYWHERE


def _required_terms(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {} if isinstance(affinity, Mapping) else {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or [] if isinstance(required, Mapping) else []
    return [t for t in terms if isinstance(t, Mapping)]
