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


def _parts(op: Op) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]


def _change(parent: Any, last: str, op: Op) -> None:
    """One add / replace / remove at member or index ``last`` of ``parent``."""
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


def apply(doc: Any, ops: Sequence[Op]) -> Any:
    """Apply add / replace / remove ops in place (the subset the webhooks emit); returns ``doc``.

    Used to check the webhooks' own patches in tests.
    """
    for op in ops:
        parts = _parts(op)
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        _change(parent, parts[-1], op)
    return doc


def applied(doc: Mapping[str, Any], ops: Sequence[Op]) -> dict[str, Any]:
    """``doc`` with ``ops`` applied, ``doc`` itself unchanged: the maps and lists on the ops' paths
    are copied (once each), everything else is shared with ``doc`` (and with the ops' values).

    How the pod webhook sees a pod as it will be stored, without a deep copy of the whole pod."""
    fresh: set[int] = set()

    def own(node: Any) -> Any:
        if id(node) in fresh:
            return node
        copied = list(node) if isinstance(node, list) else dict(node)
        fresh.add(id(copied))
        return copied

    root: dict[str, Any] = own(doc)
    for op in ops:
        parts = _parts(op)
        parent: Any = root
        for part in parts[:-1]:
            key: Any = int(part) if isinstance(parent, list) else part
            child = own(parent[key])
            parent[key] = child
            parent = child
        _change(parent, parts[-1], op)
    return root


def superseded(earlier: Sequence[Op], later: Sequence[Op]) -> list[Op]:
    """``earlier`` without the ops that ``later`` makes moot: an add or replace of an object member
    at path P sets P whole, so an earlier op at P or under it changes nothing that is stored. (A
    last token that is not a number or ``-`` can only name an object member.)"""
    whole = [
        op["path"]
        for op in later
        if op["op"] in ("add", "replace") and not (last := op["path"].rpartition("/")[2]).isdigit() and last != "-"
    ]
    return [op for op in earlier if not any(op["path"] == p or op["path"].startswith(p + "/") for p in whole)]
