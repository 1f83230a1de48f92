"""Which GPU generations have FlashInfer's allreduce-fusion kernels: one table, read by the probe's
applicability check and by the simulated hardware's model alike."""

from __future__ import annotations

import pytest

from node_agent import hardware, inventory, probe


def host(cc: tuple[int, int] | None) -> inventory.Inventory:
    gpus = tuple(inventory.Gpu(i, "GPU", f"GPU-{i}", cc=cc) for i in range(2))
    p2p = {pair: inventory.P2P(0, 0, 0, 0, 0) for pair in ((0, 1), (1, 0))}
    return inventory.Inventory("580", 13000, gpus, p2p=p2p)


@pytest.mark.parametrize(
    ("cc", "has"),
    [((9, 0), True), ((10, 0), True), ((10, 3), True), ((8, 0), False), ((8, 9), False), ((12, 0), False)],
)
def test_hopper_and_blackwell_have_comm_kernels_and_no_other_generation(cc: tuple[int, int], has: bool) -> None:
    assert inventory.has_comm_kernels(cc) is has


@pytest.mark.parametrize("major", range(6, 13))
def test_the_probe_and_the_simulated_hardware_agree_on_every_generation(major: int) -> None:
    inv = host((major, 0))
    skipped = probe.unsupported_generation(inv.gpus)
    outcome, message = hardware.derived_outcome(inv, "trtllm", [0, 1])
    assert (skipped is None) is (outcome == "pass")
    if skipped is not None:
        assert (
            skipped == f"GPU 0 is SM {major}.0: FlashInfer builds its allreduce-fusion kernels for SM 9.x and 10.x only"
        )
        assert message == f"GPU 0 is SM {major}.0; FlashInfer builds its comm kernels for SM 9.x/10.x only"


def test_an_unknown_compute_capability_is_tested_but_not_modelled_as_passing() -> None:
    inv = host(None)
    assert probe.unsupported_generation(inv.gpus) is None, "the probe tries: the test will tell"
    assert hardware.derived_outcome(inv, "trtllm", [0, 1])[0] == "fail"
