"""The FiAllreducePolicy CRD, read from the one YAML file the chart and the tests share.

The chart ships this file in its ``crds/`` folder: Helm creates the CRD on a first install and never
changes it afterwards. The operator keeps it at its own version (``run --install-crd``, which the
chart passes under ``crds.manage``) with a server-side apply, so that upgrading the operator upgrades
the schema, and no Helm release ever owns the CRD.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Final

import yaml

from fiar_operator.core.errors import ApiError, ConfigurationError, Forbidden, NotFound
from fiar_operator.state import kube

FILE: Final = "fiallreducepolicies.yaml"
FIELD_MANAGER: Final = "fiar-operator"


def text() -> str:
    return (resources.files("fiar_operator") / "crds" / FILE).read_text()


def definition() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(text())
    return doc


def apply(client: kube.Kube) -> dict[str, Any]:
    """Create the CRD, or bring the stored one to this version's schema (server-side apply)."""
    name = definition()["metadata"]["name"]
    try:
        return client.server_side_apply(kube.CRDS, definition(), FIELD_MANAGER)
    except Forbidden as exc:
        # The chart grants patch on this one CRD, which cannot create it (creating needs a
        # cluster-wide create on every CRD, which the operator is not given).
        try:
            client.call("GET", f"{kube.CRDS}/{name}")
        except NotFound:
            raise ConfigurationError(
                f"the CRD {name} is not installed and this account may not create it: install it first "
                "(helm install without --skip-crds, or: fiar-operator crd | kubectl apply --server-side -f -)"
            ) from exc
        except ApiError:
            pass  # whether it exists is unknown: the update was refused either way
        raise ConfigurationError(
            f"not allowed to update the CRD {name} ({exc}): grant patch on customresourcedefinitions named "
            f"{name} (the chart's crds.manage), or run without --install-crd"
        ) from exc
