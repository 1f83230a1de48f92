"""Engine options that fiar's values break, and what a decision leaves out for them: pure functions.

Some options make an engine refuse to start under a value fiar writes. ``BREAKS`` is the table, one
row per (engine release line, option), each read from the release's code and each run on CPU by
``bench/vllm_option_check.py`` (the release's own validation functions with fiar's values;
docs/vllm-flashinfer-paths.md has the results):

- Muse Spark's specialized decode (vLLM 0.34, ``--additional-config '{"decode_backend":
  "latency_specialized"}'``) raises ``ValueError`` at start under ``VLLM_ALLREDUCE_USE_FLASHINFER=0``
  (fiar's fusion off), and at TP 8 or 16 under a backend other than ``auto``/``mnnvl``
  (``vllm/models/muse_spark/nvidia/specialized_decode/runtime/flashinfer_ops.py`` 146-164). Such a
  pod keeps the standalone FlashInfer allreduce as its container sets it, and never gets ``trtllm``
  unless its command sets a TP of 4 (it gets ``auto``, vLLM's own default, instead).
- HiSparse (``-ac``/``--attention-config`` ``hisparse_config``, or a ``HiSparseConnector`` in
  ``--kv-transfer-config``, also inside a ``MultiConnector``) crashes in the mnnvl fused allreduce +
  RMSNorm (vLLM #64327). vLLM 0.34's ``_resolve_fi_ar_backend`` (158-172) turns ``auto`` into ``trtllm``
  on one node and into no FlashInfer backend across nodes there, but only for ``auto``: an explicit
  ``mnnvl`` bypasses it. Such a pod never gets ``mnnvl``; it gets what vLLM's own ``auto`` gives where
  that backend is verified (``trtllm`` on a node that verifies it), else the fusion off with ``auto``
  (across nodes: vLLM's guard then runs no FlashInfer allreduce at all).

DeepSeek V4.1's specialized decode (the same ``decode_backend``, 0.33+) is no row: its check reads no fusion
or backend variable, only NVLink multicast, which the multicast guard keeps off where the node does not
verify it (docs/vllm-flashinfer-paths.md, "Not a row").

Options are read from the vLLM arguments of the container's command in every form fiar reads for
``-cc``: a JSON value (``--additional-config '{...}'``, ``--additional-config={...}``), dotted keys
(``--additional-config.decode_backend=latency_specialized``, or its value as the next argument), ``_``
or ``-`` in the flag's name. vLLM gathers dotted keys into one JSON that replaces an earlier JSON value
(``vllm/utils/argparse_utils.py``), and the last JSON value wins over earlier ones; this reading does
the same. An option fiar cannot read (not JSON, not an object, too long, a shell string it cannot split,
the same dotted key twice with different values) is never guessed: every row it could trigger applies
(the values it would break are left out) and the decision says which option could not be read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import fiar_contract as contract
from fiar_operator.core import releases

ADDITIONAL: Final = "--additional-config"
ATTENTION: Final = "--attention-config"
KV_TRANSFER: Final = "--kv-transfer-config"
TENSOR_PARALLEL: Final = "--tensor-parallel-size"
_SHORT: Final = {"-ac": ATTENTION, "-tp": TENSOR_PARALLEL}
_CONFIGS: Final = (ADDITIONAL, ATTENTION, KV_TRANSFER)
MAX_JSON: Final = 16384
"""Longest JSON option value that is read; a longer one is unreadable."""
LATENCY_SPECIALIZED: Final = "latency_specialized"
HISPARSE_CONNECTOR: Final = "HiSparseConnector"
AUTO_AVOIDS_MNNVL_WITH_HISPARSE: Final[releases.Line] = (0, 34)
"""From this line vLLM's ``auto`` avoids mnnvl under HiSparse (``_resolve_fi_ar_backend`` 158-172); before
it, ``auto`` on one node tries mnnvl first."""
MNNVL_TPS: Final = frozenset({8, 16})
"""Muse Spark's ``MNNVL_TPS``: the TP sizes whose stock allreduce must be ``auto`` or ``mnnvl``."""


@dataclass(frozen=True)
class Options:
    """What a pod's vLLM commands say about the options in ``BREAKS``."""

    decode_backends: frozenset[str] = frozenset()
    """Values of ``additional_config.decode_backend`` the commands set."""
    tps: frozenset[int] = frozenset()
    """``--tensor-parallel-size`` values the commands set (empty: vLLM's default, 1)."""
    hisparse: bool = False
    """A command configures HiSparse (attention config or KV connector)."""
    unread: tuple[str, ...] = ()
    """The options that could not be read, each with why (never guessed: the rows they touch apply)."""

    def unread_option(self, flag: str) -> bool:
        return any(text.startswith(flag) for text in self.unread)

    def merged(self, other: Options) -> Options:
        return Options(
            self.decode_backends | other.decode_backends,
            self.tps | other.tps,
            self.hisparse or other.hisparse,
            tuple(dict.fromkeys(self.unread + other.unread)),
        )


NO_OPTIONS: Final = Options()


def _flag(token: str) -> tuple[str, str | None, str | None]:
    """(option, dotted key path or None, inline value or None) of one argument, as vLLM names it."""
    name, eq, value = token.partition("=")
    head, dot, path = name.partition(".")
    if head.startswith("--"):
        head = "--" + head[2:].replace("_", "-")
    head = _SHORT.get(head, head)
    return head, (path if dot else None), (value if eq else None)


def _json_value(text: str) -> Any:
    """A dotted key's value as vLLM reads it: JSON where it parses, else the string."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _set_path(doc: dict[str, Any], path: str, value: Any) -> bool:
    """``doc[a][b]... = value``; False where the key is already set to another value."""
    keys = path.split(".")
    node = doc
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            return False
        node = child
    if keys[-1] in node and node[keys[-1]] != value:
        return False
    node[keys[-1]] = value
    return True


def _configs(tokens: Sequence[str]) -> tuple[dict[str, Any], dict[str, int], list[str]]:
    """Each config option as vLLM ends up with it, the TP values, and what could not be read."""
    whole: dict[str, Any] = {}
    dotted: dict[str, dict[str, Any]] = {}
    tps: dict[str, int] = {}
    unread: list[str] = []
    i = 0
    while i < len(tokens):
        flag, path, value = _flag(tokens[i])
        if flag not in (*_CONFIGS, TENSOR_PARALLEL):
            i += 1
            continue
        if value is None:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("-"):
                unread.append(f"{flag}: without a value")
                i += 1
                continue
            i += 1
            value = tokens[i]
        i += 1
        if flag == TENSOR_PARALLEL:
            if path is not None or not value.strip().isdigit() or len(value) > 6:
                unread.append(f"{flag}: {value[:40]!r} is not a number")
            else:
                tps[str(len(tps))] = int(value)
            continue
        if len(value) > MAX_JSON:
            unread.append(f"{flag}: over {MAX_JSON} characters")
            continue
        if path is None:
            parsed = _json_value(value)
            if not isinstance(parsed, dict):
                unread.append(f"{flag}: not a JSON object")
                continue
            whole[flag] = parsed
        elif not _set_path(dotted.setdefault(flag, {}), path, _json_value(value)):
            unread.append(f"{flag}: {flag}.{path} set twice to different values")
    # vLLM's dotted keys become one JSON value, appended last, which replaces an earlier JSON value.
    return {**whole, **dotted}, tps, unread


def _has_hisparse(attention: Any, kv_transfer: Any) -> bool:
    """vLLM 0.33/0.34 ``VllmConfig``: HiSparse is on when the attention config has a ``hisparse_config``,
    or the KV transfer config names ``HiSparseConnector`` (directly or among a MultiConnector's)."""
    if isinstance(attention, dict) and attention.get("hisparse_config") is not None:
        return True
    if not isinstance(kv_transfer, dict):
        return False
    if kv_transfer.get("kv_connector") == HISPARSE_CONNECTOR:
        return True
    extra = kv_transfer.get("kv_connector_extra_config")
    children = extra.get("connectors") if isinstance(extra, dict) else None
    return kv_transfer.get("kv_connector") == "MultiConnector" and any(
        isinstance(c, dict) and c.get("kv_connector") == HISPARSE_CONNECTOR
        for c in (children if isinstance(children, list) else [])
    )


def read_vllm(tokens: Sequence[str]) -> Options:
    """The options of ``BREAKS`` in a vLLM command's arguments (see the module docstring)."""
    configs, tps, unread = _configs(tokens)
    additional = configs.get(ADDITIONAL)
    decode = additional.get("decode_backend") if isinstance(additional, dict) else None
    if decode is not None and not isinstance(decode, str):
        unread.append(f"{ADDITIONAL}: decode_backend {str(decode)[:40]!r} is not a string")
        decode = None
    return Options(
        decode_backends=frozenset({decode} if decode else ()),
        tps=frozenset(tps.values()),
        hisparse=_has_hisparse(configs.get(ATTENTION), configs.get(KV_TRANSFER)),
        unread=tuple(dict.fromkeys(unread)),
    )


def unreadable(why: str) -> Options:
    """The options of a command fiar found but could not split into arguments."""
    return Options(unread=tuple(f"{flag}: {why}" for flag in (*_CONFIGS, TENSOR_PARALLEL)))


# -- the table ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Break:
    """One option that a value of fiar makes the engine refuse: a new one is one row of BREAKS."""

    name: str
    engine: str
    since: releases.Line
    """The first release line whose code has the check (every later line is assumed to keep it)."""
    option: str
    """The option as a user writes it (for the decision's words)."""
    source: str
    """Where the release raises, or crashes (file and lines)."""
    flags: tuple[str, ...]
    """The options it is read from: an unreadable one makes the row apply."""
    decode_backend: str | None = None
    """It is set by this ``additional_config.decode_backend``."""
    hisparse: bool = False
    """It is set by HiSparse."""
    keeps_standalone: bool = False
    """It needs ``VLLM_ALLREDUCE_USE_FLASHINFER`` on: fiar never writes 0."""
    forbidden: frozenset[contract.Backend] = frozenset()
    """Backend values it refuses (where ``tp_sizes`` allow)."""
    tp_sizes: frozenset[int] = frozenset()
    """Only at these TP sizes (empty: at any); a TP fiar cannot read counts as one of them."""

    def read_set(self, options: Options) -> bool:
        """The command sets the option (as read)."""
        return (self.decode_backend is not None and self.decode_backend in options.decode_backends) or (
            self.hisparse and options.hisparse
        )

    def unread(self, options: Options) -> tuple[str, ...]:
        """The options this row reads that could not be read."""
        return tuple(u for u in options.unread if any(u.startswith(flag + ":") for flag in self.flags))

    def at_tp(self, options: Options) -> bool:
        if not self.tp_sizes:
            return True
        if options.tps & self.tp_sizes:
            return True
        return not options.tps and options.unread_option(TENSOR_PARALLEL + ":")

    def applies(self, engine: str, release: str | None, options: Options) -> bool:
        """Whether the row applies to a pod of ``release`` (None: unknown, so it may) with ``options``."""
        line = releases.line_of(release)
        if engine != self.engine or (line is not None and line < self.since):
            return False
        return self.read_set(options) or bool(self.unread(options))

    def why(self, options: Options) -> str:
        unread = "; ".join(self.unread(options))
        seen = self.option if self.read_set(options) else f"{self.option} may be set (could not read {unread})"
        return f"{seen}: vLLM refuses it ({self.source})"


BREAKS: Final[tuple[Break, ...]] = (
    Break(
        name="muse-spark-latency-specialized",
        engine="vllm",
        since=(0, 34),
        option=f'{ADDITIONAL} {{"decode_backend":"{LATENCY_SPECIALIZED}"}} (Muse Spark)',
        source="vllm/models/muse_spark/nvidia/specialized_decode/runtime/flashinfer_ops.py 146-164",
        flags=(ADDITIONAL,),
        decode_backend=LATENCY_SPECIALIZED,
        keeps_standalone=True,
        forbidden=frozenset({"trtllm"}),
        tp_sizes=MNNVL_TPS,
    ),
    Break(
        name="hisparse-mnnvl",
        engine="vllm",
        since=(0, 33),
        option=f"HiSparse ({ATTENTION} hisparse_config, or {HISPARSE_CONNECTOR} in {KV_TRANSFER})",
        source="flashinfer_all_reduce.py 158-172: the mnnvl fused allreduce + RMSNorm crashes with it, vLLM #64327",
        flags=(ATTENTION, KV_TRANSFER),
        hisparse=True,
        forbidden=frozenset({"mnnvl"}),
    ),
)
ROW: Final = {row.name: row for row in BREAKS}


@dataclass(frozen=True)
class Constraints:
    """What the rows that apply to a pod forbid fiar to write."""

    options: Options = NO_OPTIONS
    rows: tuple[Break, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rows)

    @property
    def keep_standalone(self) -> bool:
        return any(row.keeps_standalone for row in self.rows)

    @property
    def forbidden(self) -> frozenset[contract.Backend]:
        return frozenset(b for row in self.rows if row.at_tp(self.options) for b in row.forbidden)

    def standalone_why(self) -> str:
        row = next(row for row in self.rows if row.keeps_standalone)
        return f"{contract.ENV_ALLREDUCE_USE_FLASHINFER}=0 left out: {row.why(self.options)}"

    def backend_why(self, backend: str) -> str:
        row = next(row for row in self.rows if backend in row.forbidden and row.at_tp(self.options))
        return f"{contract.ENV_VAR}={backend} left out: {row.why(self.options)}"


NONE: Final = Constraints()


def constraints(engine: str, release: str | None, options: Options) -> Constraints:
    """The rows of BREAKS that apply to a pod of ``release`` with ``options``."""
    rows = tuple(row for row in BREAKS if row.applies(engine, release, options))
    return Constraints(options, rows) if rows else NONE
