"""Host policy: whether this host forbids NVLink multicast.

A host forbids multicast when its environment sets any of the variables in
``fiar_contract.HOST_POLICY_ENV`` (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``) or when the agent runs with ``--forbid-multicast``. The libraries
those variables belong to accept more spellings than the canonical value (``true``, ``off`` ...),
so this module does too: reading too much as "forbidden" is safe, reading too little is not.

On such a host the agent creates no multicast object at all: no mnnvl workspace is built, the
trtllm test runs with ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, and every child process gets all
three variables so that NCCL and NVSHMEM stay off NVLS as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import fiar_contract as contract
from node_agent import backends

_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})

FORBID_FLAG = "--forbid-multicast"


def _forbids(name: str, value: str) -> bool:
    canonical = contract.HOST_POLICY_ENV[name]
    value = value.strip().lower()
    if canonical == "0":  # an "enable" switch: off forbids
        return value in _FALSE
    return value in _TRUE  # a "disable" switch: on forbids


@dataclass(frozen=True)
class HostPolicy:
    """What the host allows, and why."""

    multicast_forbidden: bool
    sources: tuple[str, ...] = ()
    """Where the prohibition comes from, e.g. ``("env NCCL_NVLS_ENABLE=0", "--forbid-multicast")``."""

    def child_env(self, backend: contract.Backend) -> dict[str, str]:
        """Variables to set in a smoke-test child for ``backend``: the host policy's, and the
        backend's own (``backends.BackendSpec.child_env``; trtllm: ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``)."""
        env: dict[str, str] = {}
        if self.multicast_forbidden:
            env.update(contract.HOST_POLICY_ENV)
        env.update(backends.spec(backend).child_env)
        return env

    def to_dict(self) -> dict[str, object]:
        return {"multicast_forbidden": self.multicast_forbidden, "sources": list(self.sources)}


def forbidding_variables(env: Mapping[str, str]) -> list[str]:
    """``NAME=value`` for every host-policy variable in ``env`` that forbids multicast."""
    return [f"{name}={env[name]}" for name in contract.HOST_POLICY_ENV if name in env and _forbids(name, env[name])]


def resolve(environments: Iterable[tuple[str, Mapping[str, str]]], forbid_flag: bool = False) -> HostPolicy:
    """The host policy from named environments (e.g. the process and a recorded host) and the flag."""
    sources: list[str] = []
    for label, env in environments:
        sources.extend(f"{label} {item}" for item in forbidding_variables(env))
    if forbid_flag:
        sources.append(FORBID_FLAG)
    return HostPolicy(multicast_forbidden=bool(sources), sources=tuple(dict.fromkeys(sources)))


def refusal(backend: str, env: Mapping[str, str]) -> str | None:
    """Why a smoke-test rank must not run ``backend`` under ``env`` (None: it may).

    The probe never asks for a backend that needs multicast under a forbidding policy; every rank checks again before it
    imports anything, so no code path can build a multicast object on such a host.
    """
    spec = backends.BY_NAME.get(backend)
    if spec is not None and spec.needs_multicast:
        found = forbidding_variables(env)
        if found:
            return f"host policy forbids multicast ({', '.join(found)}): no {backend} workspace is created"
    return None
