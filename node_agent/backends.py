"""The agent's backend table: one row per FlashInfer allreduce backend it tests.

What the agent knows of a backend beyond its name lives in its row: the world sizes FlashInfer
supports for it, the FlashInfer module the smoke worker and ``prebuild`` build and load, the
variables its smoke-test children always get, and whether it needs NVLink multicast (a host that
forbids multicast never tests it). Rows follow ``fiar_contract.BACKENDS``, the order of preference:
the probe tests them in this order and the verdict is the first that passed (a test checks the
two agree). Adding a backend: docs/DESIGN.md#adding-a-backend.

This module imports neither torch nor FlashInfer: the resident agent and every child read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import fiar_contract as contract


@dataclass(frozen=True)
class BackendSpec:
    name: contract.Backend
    world_sizes: tuple[int, ...]
    """Ranks FlashInfer's workspace accepts; a test uses the largest one not above the GPU count."""
    module: str
    """The FlashInfer module holding the backend's comm kernels (imported in a child only)."""
    generator: str
    """Its function returning the JIT spec of the comm module (build and cache state)."""
    loader: str
    """Its function that builds (if needed) and loads the comm module."""
    child_env: tuple[tuple[str, str], ...] = ()
    """Variables every smoke-test child of this backend gets, whatever the host policy."""
    needs_multicast: bool = False
    """Its workspace needs an NVLink multicast object: never tested where the host forbids multicast,
    and its result is what proves multicast works (``verdict.multicast_state``)."""

    def world_size(self, available: int) -> int | None:
        """The largest world size not above ``available`` GPUs; None when there is none."""
        fitting = [n for n in self.world_sizes if n <= available]
        return max(fitting) if fitting else None


TABLE: Final[tuple[BackendSpec, ...]] = (
    BackendSpec(
        "mnnvl",
        world_sizes=(2, 4, 8, 16, 32, 64),
        module="flashinfer.comm.trtllm_mnnvl_ar",
        generator="gen_trtllm_mnnvl_comm_module",
        loader="get_trtllm_mnnvl_comm_module",
        needs_multicast=True,
    ),
    BackendSpec(
        "trtllm",
        world_sizes=(2, 4, 8, 16),
        module="flashinfer.comm.trtllm_ar",
        generator="gen_trtllm_comm_module",
        loader="get_trtllm_comm_module",
        # Its kernels never use multicast, and FlashInfer 0.6.10-0.6.15 would otherwise let PyTorch
        # create multicast objects for its buffers.
        child_env=(("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),),
    ),
)
BY_NAME: Final[Mapping[str, BackendSpec]] = {b.name: b for b in TABLE}
NAMES: Final[tuple[contract.Backend, ...]] = tuple(b.name for b in TABLE)
RANK_COUNTS: Final[tuple[int, ...]] = tuple(sorted({n for b in TABLE for n in b.world_sizes}))
"""Every world size some backend supports: the values ``--gpus`` accepts."""
MULTICAST_PROOF: Final[contract.Backend] = next(b.name for b in TABLE if b.needs_multicast)
"""The backend whose result says whether multicast works on the host."""


def spec(name: contract.Backend) -> BackendSpec:
    return BY_NAME[name]


def allowed(multicast_forbidden: bool) -> tuple[BackendSpec, ...]:
    """The backends a host may test (those needing multicast only where the host allows it)."""
    return tuple(b for b in TABLE if not (multicast_forbidden and b.needs_multicast))
