"""SGLang's option by the node's GPU generation (``fiar.io/compute-capability``): its own choice wherever
every backend SGLang's ``auto`` can resolve to on that generation is verified, the enforce-disable switch
wherever it could resolve to one that is not. The reference below restates SGLang's own rules (0.5.20 and
0.5.23: ``_flashinfer_allreduce_fusion_auto_enable`` in ``arg_groups/overrides.py``, ``_resolve_backend``
in ``layers/flashinfer_comm_fusion.py``); bench/sglang_check.py runs them."""

from __future__ import annotations

from itertools import combinations

import pytest

import fiar_contract as contract
from fiar_operator.core.nodefacts import node_facts
from fiar_operator.core.sglang import sglang_flag

GENERATIONS: tuple[tuple[int, int] | None, ...] = (None, (8, 0), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0))
SUBSETS: tuple[frozenset[contract.Backend], ...] = tuple(
    frozenset(c) for n in range(len(contract.BACKENDS) + 1) for c in combinations(contract.BACKENDS, n)
)


def sglang_may_run(cc: tuple[int, int], multi: bool) -> frozenset[str]:
    """What SGLang's own choice resolves to on GPUs of ``cc`` for some model (MiMo's cutedsl: as mnnvl)."""
    sm90, sm100 = cc[0] == 9, cc[0] == 10
    if not (sm90 or sm100) or (multi and not sm100):  # the auto-enable pass does not run
        return frozenset()
    return frozenset({"mnnvl" if sm100 else "trtllm"})  # _resolve_backend("auto", is_multi_node)


@pytest.mark.parametrize("multi", [False, True], ids=["one-pod", "group"])
@pytest.mark.parametrize("verified", SUBSETS, ids=lambda s: "+".join(sorted(s)) or "nothing")
@pytest.mark.parametrize("cc", GENERATIONS, ids=lambda cc: contract.compute_capability_text(cc) if cc else "unknown")
def test_sglang_keeps_its_own_choice_only_where_whatever_it_resolves_to_is_verified(
    cc: tuple[int, int] | None, verified: frozenset[contract.Backend], multi: bool
) -> None:
    flag = sglang_flag("on", True, verified, multi, cc)
    possible = (
        frozenset().union(*(sglang_may_run(known, multi) for known in GENERATIONS if known))
        if cc is None
        else sglang_may_run(cc, multi)
    )
    assert flag == ("engine" if possible <= verified else "off")


@pytest.mark.parametrize("cc", GENERATIONS)
@pytest.mark.parametrize("multi", [False, True])
def test_a_decision_with_the_fusion_off_is_the_enforce_disable_switch_on_every_generation(
    cc: tuple[int, int] | None, multi: bool
) -> None:
    assert sglang_flag("off", True, frozenset(contract.BACKENDS), multi, cc) == "off"


@pytest.mark.parametrize("raw", ["9.0", "10.0", "10.3", "12.1"])
def test_the_compute_capability_label_is_read_as_the_agent_writes_it(raw: str) -> None:
    facts = node_facts("n", {contract.LABEL_COMPUTE_CAPABILITY: raw})
    assert facts.compute_capability is not None
    assert contract.compute_capability_text(facts.compute_capability) == raw


@pytest.mark.parametrize(
    "raw", ["", "9", "9.", "9.0.1", "09.0", "9.10", " 9.0", "9.0\n", "sm90", "0.0", "1e3", "\uff19.0", "9" * 40]
)
def test_a_compute_capability_label_not_of_the_agents_form_reads_as_not_known(raw: str) -> None:
    assert node_facts("n", {contract.LABEL_COMPUTE_CAPABILITY: raw}).compute_capability is None
