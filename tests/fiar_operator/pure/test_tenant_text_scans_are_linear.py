"""Every pattern fiar applies to a pod's text ends in time linear in that text, at the size bounds.

A tenant's dry-run pod may hold up to ``limits.MAX_CHARACTERS`` characters of commands, args and env
that planning reads. A pattern that backtracks over overlapping matches (``eval[^;]*vllm serve`` on
``eval eval eval ...``) held the interpreter half an hour on such a pod, the GIL with it: neither the
event loop, the review's deadline nor the review threads bound it. Each pattern is run here on inputs
built from its own words, repeated to the size bound, under a generous time bound enforced by a
timer signal (the regular-expression engine checks signals as it runs).
"""

from __future__ import annotations

import random
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import pytest

from fiar_operator.core import commands, limits, names, options, policy, releases, selectors, sglang
from fiar_operator.core.commands import plan_command

MODULES: tuple[ModuleType, ...] = (commands, limits, names, options, policy, releases, selectors, sglang)
"""The modules whose code reads a pod's (or a policy's) text."""
BOUND_S = 3.0
"""Per search at MAX_CHARACTERS; a linear scan takes 5-50 ms, the old eval pattern about 35 min."""
SIZE = limits.MAX_CHARACTERS


def _patterns_in(value: Any, seen: set[int]) -> Iterator[re.Pattern[str]]:
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, re.Pattern):
        yield value
    elif isinstance(value, (tuple, list, frozenset, set)):
        for item in value:
            yield from _patterns_in(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _patterns_in(item, seen)
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from _patterns_in(getattr(value, f.name), seen)


def every_pattern() -> list[re.Pattern[str]]:
    seen: set[int] = set()
    found = [p for module in MODULES for v in vars(module).values() for p in _patterns_in(v, seen)]
    return sorted(found, key=lambda p: p.pattern)


def adversarial(pattern: re.Pattern[str]) -> Iterator[tuple[str, str]]:
    """(what, text) of MAX_CHARACTERS built from the pattern's own words and punctuation: each word
    repeated with and without spaces, prefixes of the whole pattern repeated, and the reported attack."""
    source = re.sub(r"\\[A-Za-z]", " ", pattern.pattern)
    words = sorted(set(re.findall(r"[A-Za-z_][A-Za-z0-9_.-]*", source)) | {"eval", "vllm serve"})
    pieces = [*words, "$", "${", "/", ".", " ", "1", "a-", "-m "]
    for piece in pieces:
        yield f"{piece!r} repeated", (piece * (SIZE // len(piece) + 1))[:SIZE]
        yield f"{piece!r} and a space repeated", ((piece + " ") * (SIZE // (len(piece) + 1) + 1))[:SIZE]
    spelled = " ".join(words)
    for cut in range(1, len(spelled) + 1, max(1, len(spelled) // 4)):
        yield f"{spelled[:cut]!r} repeated", ((spelled[:cut] + " ") * (SIZE // (cut + 1) + 1))[:SIZE]
    head = "vllm serve m ${VLLM_ADDITIONAL_ARGS} "
    yield "the reported eval attack", (head + "eval " * SIZE)[:SIZE]


class Late(Exception):
    pass


def _late(signum: int, frame: FrameType | None) -> None:
    raise Late


def _timed(call: Any, bound: float = BOUND_S) -> float:
    """``call()``'s seconds; raises Late past ``bound`` (a timer signal interrupts a running search)."""
    previous = signal.signal(signal.SIGALRM, _late)
    signal.setitimer(signal.ITIMER_REAL, bound)
    started = time.perf_counter()
    try:
        call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.perf_counter() - started


def test_the_scans_find_the_patterns_of_the_engine_table() -> None:
    found = {p.pattern for p in every_pattern()}
    for engine in commands.ENGINES:
        assert engine.shell_reference.pattern in found
        assert all(p.pattern in found for p in engine.not_servers)
        assert all(entry.spelling.pattern in found for entry in engine.entries)
    assert len(found) >= 15


def test_no_pattern_is_built_where_it_is_used() -> None:
    """Every pattern is compiled once, where ``every_pattern`` finds it (module level or a table row)."""
    for module in MODULES:
        source = Path(module.__file__ or "").read_text()
        assert not re.search(r"\bre\.(search|match|fullmatch|sub|subn|split|findall|finditer)\(", source), module


@pytest.mark.parametrize("pattern", every_pattern(), ids=lambda p: p.pattern[:60])
def test_every_pattern_ends_in_time_on_adversarial_text_at_the_size_bound(pattern: re.Pattern[str]) -> None:
    for what, text in adversarial(pattern):
        try:
            for method in (pattern.search, pattern.fullmatch):
                _timed(lambda method=method, text=text: method(text))
        except Late:
            pytest.fail(f"{pattern.pattern!r} on {what} ({len(text)} characters) took over {BOUND_S} s")


def _shell_container(script: str) -> dict[str, Any]:
    return {"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", script]}


@pytest.mark.parametrize(
    "script",
    [
        "vllm serve m ${VLLM_ADDITIONAL_ARGS} " + "eval " * (SIZE // 5),
        "vllm serve m ${VLLM_ADDITIONAL_ARGS} " + "eval " * (commands.MAX_SCRIPT // 5 - 10),
        "vllm serve m ${VLLM_ADDITIONAL_ARGS} eval " + "vllm servex " * (commands.MAX_SCRIPT // 12 - 10),
        "python3 -m " * (SIZE // 11),
        "sglang serve " + " " * SIZE,
    ],
    ids=["eval at MAX_CHARACTERS", "eval at MAX_SCRIPT", "eval then vllm servex", "python -m", "spaces"],
)
def test_planning_a_hostile_shell_command_ends_in_time(script: str) -> None:
    try:
        took = _timed(lambda: plan_command(_shell_container(script)))
    except Late:
        pytest.fail(f"planning a {len(script)}-character script took over {BOUND_S} s")
    assert took < BOUND_S


def test_a_script_over_the_bound_is_not_understood_and_reported() -> None:
    plan = plan_command(_shell_container("vllm serve m ${VLLM_ADDITIONAL_ARGS} $@ " + "#" * commands.MAX_SCRIPT))
    assert not plan.understood and plan.mentions_vllm
    assert f"at most {commands.MAX_SCRIPT}" in plan.reason


OLD_EVAL_SERVE = re.compile(r"\beval\b[^\n;&|]*\bvllm serve\b")
"""The pattern the single pass replaced: same answers, quadratic time."""


def test_the_eval_scan_answers_as_the_pattern_it_replaced() -> None:
    rng = random.Random(34)
    parts = ["eval", "vllm", "serve", "vllm serve", " ", ";", "&", "|", "\n", "x", "evalx", '"', "exec", "$@"]
    for _ in range(20_000):
        script = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert commands._eval_runs_serve(script) == bool(OLD_EVAL_SERVE.search(script)), repr(script)
