"""The pod webhook's words for a ``NCCL_NVLS_ENABLE`` value fiar does not write agree with what NCCL's own
parser returned for it on 2.31.2 and 2.32.6 (bench/nccl_param_check.py; results.json)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fiar_operator.admission.mutation import nccl_nvls_reading

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results" / "nccl-param-check" / "results.json"
READ = json.loads(RESULTS.read_text())
KNOWN = {"unset", "''"}  # what fiar writes itself (the guard's 0 and the empty "own" value)


@pytest.mark.parametrize("key", sorted(set(READ["2.31.2"]) - KNOWN))
def test_the_words_name_what_each_nccl_release_reads(key: str) -> None:
    value = ast.literal_eval(key)
    words = nccl_nvls_reading(value)
    old, new = READ["2.31.2"][key]["value"], READ["2.32.6"][key]["value"]
    if old == new:
        assert words.startswith(f"NCCL reads it as {old} ")
    else:
        assert (old, new) == (0, 2)
        assert "up to 2.31 reads it as 0" in words and "2.32 as its default 2" in words


def test_an_empty_value_is_nccls_default_on_both_releases() -> None:
    assert READ["2.31.2"]["''"]["value"] == READ["2.32.6"]["''"]["value"] == READ["2.32.6"]["unset"]["value"] == 2
