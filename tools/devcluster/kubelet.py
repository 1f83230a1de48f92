"""What the kubelet makes of a container's command, args and environment, for tests and the engine
checks (bench/): ``$(VAR)`` expansion as k8s.io/kubernetes third_party/forked/golang/expansion does
it, and the process it starts. The operator itself never resolves a pod's variables: the kubelet
does, on the node; this is the one copy that the tests and the checks against vLLM's and SGLang's
own parsers share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` expansion as the kubelet does it in env values, command and args
    (k8s.io/kubernetes third_party/forked/golang/expansion): a defined variable is replaced, an undefined
    reference is kept as written, ``$$`` gives ``$``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            following = text[i + 1]
            if following == "$":
                out.append("$")
                i += 2
                continue
            if following == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


class Process(NamedTuple):
    """What the kubelet starts for a container."""

    argv: list[str]
    """Command and args after expansion (the image's entrypoint, for args only, is not part of it)."""
    env: dict[str, str]


def container_process(pod: Mapping[str, Any], container: Mapping[str, Any]) -> Process:
    """The process the kubelet starts for ``container`` of ``pod``: env entries in order,
    a fieldRef to an annotation the pod lacks gives "", a value expands the variables defined before it;
    command and args expand against the whole environment."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = str(entry["name"])
        path = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if path is not None:
            key = str(path).removeprefix("metadata.annotations['").removesuffix("']")
            env[name] = str(annotations.get(key, ""))
        else:
            env[name] = expand(str(entry.get("value") or ""), env)
    argv = [expand(str(t), env) for t in (container.get("command") or []) + (container.get("args") or [])]
    return Process(argv, env)
