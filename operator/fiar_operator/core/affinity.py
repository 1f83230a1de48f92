"""Scheduling constraints the pod webhook injects, merged into whatever the pod already asks for.

A required node affinity is a list of node-selector terms that are ORed; a requirement that must
hold everywhere is therefore appended to *every* term (and becomes the only term when there is none).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import fiar_contract as contract

Json = dict[str, Any]


def backend_requirement(backends: Sequence[str]) -> Json:
    """Nodes whose verdict is one of ``backends`` (which nodes verify what: ``nodefacts``)."""
    return {"key": contract.LABEL_BACKEND, "operator": "In", "values": list(backends)}


def clique_requirement() -> Json:
    return {"key": contract.LABEL_CLIQUE, "operator": "Exists"}


def clique_pod_affinity(group_label: str, group_key: str) -> Json:
    """A required pod-affinity term: the pod goes to a node in the same clique as its group's pods."""
    return {"labelSelector": {"matchLabels": {group_label: group_key}}, "topologyKey": contract.LABEL_CLIQUE}


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (
        a.get("key") == b.get("key")
        and a.get("operator") == b.get("operator")
        and sorted(a.get("values") or []) == sorted(b.get("values") or [])
    )


def merge_node_requirements(affinity: Mapping[str, Any] | None, requirements: Sequence[Json]) -> Json:
    """A copy of ``affinity`` whose required node affinity also demands ``requirements`` in every term."""
    return merge_node_alternatives(affinity, [requirements])


def merge_node_alternatives(affinity: Mapping[str, Any] | None, alternatives: Sequence[Sequence[Json]]) -> Json:
    """A copy of ``affinity`` whose required node affinity also demands one of ``alternatives`` (each a
    list of ANDed requirements) in every term: a term that already holds one is kept, any other is
    replaced by one copy per alternative (terms are ORed). Merging twice changes nothing more."""
    result: Json = copy.deepcopy(dict(affinity or {}))
    node_affinity = result.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    merged: list[Json] = []
    for term in required.get("nodeSelectorTerms") or [{}]:
        exprs = term.get("matchExpressions") or []
        if any(all(any(_same(req, e) for e in exprs) for req in alt) for alt in alternatives):
            merged.append(term)
            continue
        for alt in alternatives:
            copied = copy.deepcopy(term)
            added = copied.setdefault("matchExpressions", [])
            added.extend(copy.deepcopy(req) for req in alt if not any(_same(req, e) for e in exprs))
            merged.append(copied)
    required["nodeSelectorTerms"] = merged
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return result


def merge_pod_affinity(affinity: Mapping[str, Any] | None, term: Json) -> Json:
    """A copy of ``affinity`` with ``term`` among its required pod-affinity terms (added once)."""
    result: Json = copy.deepcopy(dict(affinity or {}))
    pod_affinity = result.setdefault("podAffinity", {})
    terms = pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
    if term not in terms:
        terms.append(copy.deepcopy(term))
    return result
