"""The operator's rooms import one way (docs/operator.md, "Rooms"): ``core`` imports no other room,
``state`` only ``core``, ``admission`` and ``reconcile`` only ``core`` and ``state`` (never each
other), and no room imports the composition root. Read from the source, as an import linter would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fiar_operator

PACKAGE = Path(fiar_operator.__file__).parent
ROOMS = ("core", "state", "admission", "reconcile")
ALLOWED = {
    "core": {"core"},
    "state": {"core", "state"},
    "admission": {"core", "state", "admission"},
    "reconcile": {"core", "state", "reconcile"},
}


def imported(path: Path) -> set[str]:
    """Every ``fiar_operator`` module ``path`` imports (type-checking imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fiar_operator")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fiar_operator"):
            if node.module == "fiar_operator" or node.module in {f"fiar_operator.{r}" for r in ROOMS}:
                found |= {f"{node.module}.{a.name}" for a in node.names}
            else:
                found.add(node.module)
    return found


def room_of(module: str) -> str:
    """The room of ``fiar_operator.<room>.<module>``; ``root`` for the composition root's modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "root"


def modules(room: str) -> list[Path]:
    return sorted((PACKAGE / room).glob("*.py"))


@pytest.mark.parametrize("room", ROOMS)
def test_a_room_imports_only_the_rooms_beneath_it(room: str) -> None:
    wrong = {
        f"{path.name} -> {module}"
        for path in modules(room)
        for module in imported(path)
        if room_of(module) not in ALLOWED[room]
    }
    assert wrong == set(), f"{room} may import only {sorted(ALLOWED[room])}"


def test_every_module_of_the_operator_lives_in_a_room_or_is_the_composition_root() -> None:
    loose = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py", "cli.py", "handlers.py", "runtime.py", "crd.py"}
    assert loose == set()


def test_the_reading_of_imports_sees_a_room_import() -> None:
    """The check above would pass on a reader that sees nothing: it sees the reconciler's imports."""
    seen = {room_of(m) for m in imported(PACKAGE / "reconcile" / "reconciler.py")}
    assert seen == {"core", "state", "reconcile"}
