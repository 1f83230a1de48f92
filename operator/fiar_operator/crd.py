"""The FiAllreducePolicy CRD, read from the one YAML file the chart and the tests share."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

FILE = "fiallreducepolicies.yaml"


def text() -> str:
    return (resources.files("fiar_operator") / "crds" / FILE).read_text()


def definition() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(text())
    return doc
