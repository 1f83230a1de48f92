"""kubectl's convention: colour on a terminal, never in a pipe, never with NO_COLOR; --color overrides."""

from __future__ import annotations

import io

import pytest

from kubectl_fiar import cli, model, render


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("out", "argv", "no_color", "colour"),
    [
        (Terminal(), [], None, True),
        (io.StringIO(), [], None, False),
        (Terminal(), [], "1", False),
        (io.StringIO(), ["--color", "always"], None, True),
        (Terminal(), ["--color", "never"], None, False),
    ],
)
def test_colour_follows_the_terminal(
    out: io.StringIO, argv: list[str], no_color: str | None, colour: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    style = cli._style(cli.parser().parse_args(["status", *argv]), out)
    assert style.colour is colour
    node = model.node_record({"metadata": {"name": "n", "labels": {"fiar.io/backend": "trtllm"}}})
    text = render.status_text(model.fleet([node], [], [], now=0.0), style, "all namespaces")
    assert ("\x1b[32m" in text) is colour


def test_flags_work_before_and_after_the_command() -> None:
    before = cli.parser().parse_args(["-o", "json", "--context", "c", "status"])
    after = cli.parser().parse_args(["status", "-o", "json", "--context", "c"])
    assert (before.output, before.context) == (after.output, after.context) == ("json", "c")
    assert cli.parser().parse_args(["why", "n1", "--json"]).output == "json"
