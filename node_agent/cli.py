"""``fiar-agent`` entry point."""

from __future__ import annotations

import argparse

from node_agent import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fiar-agent",
        description="Probe NVLink multicast and FlashInfer allreduce backends on this node.",
    )
    parser.add_argument("--version", action="version", version=f"fiar-agent {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    return 0
