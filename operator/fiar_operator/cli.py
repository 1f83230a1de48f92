"""``fiar-operator`` entry point."""

from __future__ import annotations

import argparse

from fiar_operator import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fiar-operator",
        description="Give every selected vLLM container the FlashInfer allreduce backend verified "
        "on the node it is bound to.",
    )
    parser.add_argument("--version", action="version", version=f"fiar-operator {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    return 0
