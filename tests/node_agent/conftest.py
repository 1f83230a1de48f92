"""Helpers for all of the node agent's tests: shipped fixtures, changed and written to a file."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node_agent import hardware

FIXTURES = hardware.FIXTURES


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.fixture
def host_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a shipped fixture, changed by ``edit(doc)``, to a temporary file."""
    counter = iter(range(1000))

    def make(name: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        doc = copy.deepcopy(load(name))
        if edit is not None:
            edit(doc)
        path = tmp_path / f"{name}-{next(counter)}.json"
        path.write_text(json.dumps(doc, indent=1))
        return path

    return make
