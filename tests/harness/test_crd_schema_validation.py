"""The API server enforces a CRD's OpenAPI schema (tier A): proof that the plane is a real one."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster.cluster import ControlPlane

pytestmark = pytest.mark.controlplane


def _crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "color": {"type": "string", "enum": ["red", "blue"]},
                        },
                    }},
                }},
            }],
        },
    }


def _wait_established(ext: client.ApiextensionsV1Api, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(name)
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} never became Established")


def test_crd_schema_rejects_a_bad_object_and_accepts_a_good_one(plane_a: ControlPlane, unique: str) -> None:
    group = f"t{unique}.fiar.test"
    with plane_a.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        ext.create_custom_resource_definition(_crd(group))
        _wait_established(ext, f"widgets.{group}")
        objs = client.CustomObjectsApi(api)
        bad = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "bad"},
               "spec": {"size": 0, "color": "green"}}
        with pytest.raises(ApiException) as err:
            objs.create_cluster_custom_object(group, "v1", "widgets", bad)
        assert err.value.status == 422
        assert "spec.size" in err.value.body and "spec.color" in err.value.body
        good = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "good"}, "spec": {"size": 3}}
        created = objs.create_cluster_custom_object(group, "v1", "widgets", good)
        assert created["spec"] == {"size": 3}
