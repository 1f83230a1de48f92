"""JSONPatch (RFC 6902) operations for admission responses."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

Op = dict[str, Any]


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) from unescaped path parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def set_map_entries(obj: Mapping[str, Any], path: tuple[str, ...], entries: Mapping[str, str]) -> list[Op]:
    """Ops that make every ``entries`` item present in the map at ``path`` (one op when it is missing)."""
    current: Any = obj
    for depth, part in enumerate(path):
        child = current.get(part) if isinstance(current, Mapping) else None
        if not isinstance(child, Mapping):
            value: Any = dict(entries)
            for outer in reversed(path[depth + 1 :]):
                value = {outer: value}
            return [{"op": "add", "path": pointer(*path[: depth + 1]), "value": value}]
        current = child
    return [
        {"op": "add", "path": pointer(*path, key), "value": value}
        for key, value in entries.items()
        if current.get(key) != value
    ]


def encode(ops: Sequence[Op]) -> str:
    """The base64 form an AdmissionResponse carries."""
    return base64.b64encode(json.dumps(list(ops), separators=(",", ":")).encode()).decode()


def apply(doc: Any, ops: Sequence[Op]) -> Any:
    """Apply add / replace / remove ops in place (the subset the webhooks emit); returns ``doc``.

    Used to check the webhooks' own patches in tests and to see a pod as it will be stored.
    """
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(index, op["value"])
            elif op["op"] == "replace":
                parent[index] = op["value"]
            elif op["op"] == "remove":
                del parent[index]
        elif op["op"] in ("add", "replace"):
            parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[last]
    return doc
