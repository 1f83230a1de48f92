"""The bodies of the objects fiar's tests, benchmarks and demo create: pods, Deployments, policies, and
the GPU node's taint and toleration.

One builder a kind of object, with the fields that differ between its users as parameters: the vLLM
Deployment the demo shows is the one the tests run on the control plane, with the demo's image, labels
and GPU request. Every builder returns a fresh body (the containers passed in are copied), so a caller
may change what it gets back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import fiar_contract as contract

Body = dict[str, Any]

VLLM_IMAGE = "vllm/vllm-openai"
VLLM_LABELS: Mapping[str, str] = {"app": "vllm"}
SGLANG_LABELS: Mapping[str, str] = {"app": "sglang"}
GPU_PRESENT: Mapping[str, str] = {"nvidia.com/gpu.present": "true"}
"""The label of a node with NVIDIA GPUs (the GPU operator's), that the demo's Deployments select."""
GPU_TAINT: Mapping[str, str] = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION: Mapping[str, str] = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def container(name: str = "vllm", image: str = VLLM_IMAGE, **fields: Any) -> Body:
    """A container: a vLLM one unless told otherwise; ``fields`` (command, args, env, resources...) as given."""
    return {"name": name, "image": image, **fields}


def explicit_backend(value: str = "trtllm") -> Body:
    """A vLLM container that sets fiar's backend variable itself."""
    return container(env=[{"name": contract.ENV_VAR, "value": value}])


def pod(
    *containers: Mapping[str, Any],
    name: str | None = None,
    generate_name: str | None = "vllm-",
    namespace: str | None = "ml",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Body:
    """A Pod: ``containers`` (copied; one vLLM container when none is given) and ``spec``'s other fields.

    The metadata holds ``name`` or ``generate_name``, ``namespace``, and ``labels`` and ``annotations``,
    each only where it is given (not None)."""
    meta: Body = {}
    if name is not None:
        meta["name"] = name
    elif generate_name is not None:
        meta["generateName"] = generate_name
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [copy.deepcopy(dict(c)) for c in containers] or [container()], **spec},
    }


def probe_pod() -> Body:
    """The smallest pod: created with ``dryRun`` to see whether the API server calls a webhook yet."""
    return pod(container("c", "probe"), generate_name="probe-", namespace=None)


def spread_by_hostname(labels: Mapping[str, str], when_unsatisfiable: str = "DoNotSchedule") -> Body:
    """A topology spread constraint: the pods ``labels`` select, spread one per node."""
    return {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": when_unsatisfiable,
        "labelSelector": {"matchLabels": dict(labels)},
    }


def deployment(
    name: str,
    replicas: int,
    labels: Mapping[str, str],
    containers: Sequence[Mapping[str, Any]],
    *,
    node_selector: Mapping[str, str],
    spread: str | None = "DoNotSchedule",
    tolerations: Sequence[Mapping[str, str]] = (),
) -> Body:
    """A Deployment of ``replicas`` pods labelled ``labels`` on the nodes ``node_selector`` selects.

    ``spread``: the pods' ``whenUnsatisfiable`` for one pod per node, or None for no spread constraint;
    ``tolerations``: the pods' (none when empty)."""
    pod_spec: Body = {"nodeSelector": dict(node_selector)}
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    if spread is not None:
        pod_spec["topologySpreadConstraints"] = [spread_by_hostname(labels, spread)]
    pod_spec["containers"] = [copy.deepcopy(dict(c)) for c in containers]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def vllm_deployment(
    replicas: int,
    *containers: Mapping[str, Any],
    node_selector: Mapping[str, str],
    name: str = "vllm",
    labels: Mapping[str, str] = VLLM_LABELS,
    spread: str | None = "DoNotSchedule",
    tolerations: Sequence[Mapping[str, str]] = (),
) -> Body:
    """The Deployment of vLLM pods: one vLLM container (``vllm/vllm-openai``) unless ``containers`` are given,
    spread one pod per node."""
    return deployment(
        name,
        replicas,
        labels,
        containers or [container()],
        node_selector=node_selector,
        spread=spread,
        tolerations=tolerations,
    )


def sglang_deployment(
    replicas: int,
    *containers: Mapping[str, Any],
    node_selector: Mapping[str, str],
    name: str = "sglang",
    labels: Mapping[str, str] = SGLANG_LABELS,
    spread: str | None = "DoNotSchedule",
    tolerations: Sequence[Mapping[str, str]] = (),
) -> Body:
    """The Deployment of SGLang pods, spread one pod per node; its containers are the caller's."""
    return deployment(
        name, replicas, labels, containers, node_selector=node_selector, spread=spread, tolerations=tolerations
    )


def policy(name: str, **spec: Any) -> Body:
    """A FiAllreducePolicy body with ``spec`` as given."""
    return {
        "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
