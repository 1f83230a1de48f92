"""Each image is keyed on the Dockerfile stages it is built from, not on the whole Dockerfile (pure).

A change to the agent's stages must not rebuild the operator and agent-sim images (each a
multi-architecture build, arm64 under qemu), and a change to theirs must not rebuild the multi-GB agent.
"""

from __future__ import annotations

import os
from pathlib import Path

from devcluster import images

DOCKERFILE = (images.ROOT / "Dockerfile").read_text()


def _keys(text: str) -> dict[str, str]:
    return {target: images.dockerfile_key(target, text) for target in ("operator", "agent-sim", "agent")}


def _edit_stage(text: str, stage: str, line: str) -> str:
    """``text`` with ``line`` added as the last instruction of ``stage``."""
    lines = text.splitlines()
    start = next(i for i, raw in enumerate(lines) if raw.startswith("FROM ") and raw.endswith(f" AS {stage}"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("FROM ")), len(lines))
    while end > start and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1
    return "\n".join([*lines[:end], line, *lines[end:]]) + "\n"


def test_each_target_uses_only_the_stages_it_is_built_from_or_copies_from() -> None:
    _, stages = images.dockerfile_stages(DOCKERFILE)
    assert images.stages_used("operator", stages) == ["operator-build", "operator"]
    assert images.stages_used("agent-sim", stages) == ["operator-build", "agent-sim"]
    assert images.stages_used("agent", stages) == ["agent-base", "agent-build", "agent"]


def test_a_change_to_an_agent_stage_leaves_the_operator_and_agent_sim_keys_alone() -> None:
    before = _keys(DOCKERFILE)
    for stage in ("agent-base", "agent-build", "agent"):
        after = _keys(_edit_stage(DOCKERFILE, stage, "RUN true"))
        assert after["operator"] == before["operator"] and after["agent-sim"] == before["agent-sim"], stage
        assert after["agent"] != before["agent"], stage


def test_a_change_to_the_operators_build_stage_rebuilds_both_images_made_from_it_and_not_the_agent() -> None:
    before = _keys(DOCKERFILE)
    after = _keys(_edit_stage(DOCKERFILE, "operator-build", "RUN true"))
    assert after["operator"] != before["operator"] and after["agent-sim"] != before["agent-sim"]
    assert after["agent"] == before["agent"]


def test_comments_and_blank_lines_change_no_key_and_a_global_arg_changes_every_key() -> None:
    before = _keys(DOCKERFILE)
    assert _keys(DOCKERFILE.replace("\n# ", "\n#  ").replace("\n\n", "\n\n\n")) == before
    with_arg = DOCKERFILE.replace("ARG PYTHON_VERSION=", "ARG EXTRA=1\nARG PYTHON_VERSION=", 1)
    assert all(a != b for a, b in zip(_keys(with_arg).values(), before.values(), strict=True))


def test_a_stage_copied_through_a_mount_counts_as_used() -> None:
    text = "ARG X=1\nFROM a AS tools\nRUN make\nFROM b AS other\nRUN true\nFROM c AS app\n"
    text += "RUN --mount=type=bind,from=tools,target=/t ls\n"
    _, stages = images.dockerfile_stages(text)
    assert images.stages_used("app", stages) == ["tools", "app"]


def test_pruning_the_agents_archives_leaves_the_agent_sims_alone(tmp_path: Path) -> None:
    def archive(name: str, n: int) -> Path:
        path = tmp_path / f"{name}-{n:016x}.tar"
        path.write_bytes(b"")
        os.utime(path, (n, n))
        return path

    sims = [archive("agent-sim", n) for n in range(1, 5)]
    agents = [archive("agent", n) for n in range(10, 15)]
    images._prune("agent", agents[-1])
    assert all(path.exists() for path in sims)
    assert [path.exists() for path in agents] == [False, False, True, True, True]
