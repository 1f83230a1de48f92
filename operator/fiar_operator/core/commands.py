"""How a vLLM or SGLang container's command is made to read fiar's fusion decision: pure functions.

Each engine is one row of ``ENGINES`` (its entries, the editor of its arguments, its references and
placeholders, what runs no server of it); ``plan_command`` reads a container through the table. vLLM's
rules follow; SGLang's (``python -m sglang.launch_server`` and ``sglang serve`` in exec form, a shell
string holding ``"${FIAR_SGLANG_ARGS}"`` right after the entry) are at ``_sglang_edit`` and in
docs/sglang.md: fiar inserts ``$(FIAR_SGLANG_ARGS)`` before the user's options, and leaves alone (and
reports) ``--config``, both the enforce-disable switch and a backend, an unknown backend value, and an
abbreviated fusion option.

vLLM has no environment variable that turns its AR+RMSNorm fusion pass off; the switch is the
compilation config, a command-line flag (``-cc.pass_config.fuse_allreduce_rms=false``, or the same key
inside a JSON ``--compilation-config``). The decision is only known at binding, after the command is
fixed, so the pod webhook puts a reference into the command that the kubelet expands when it starts
the container: ``$(FIAR_FUSE_ALLREDUCE_RMS)``, an env var read through a fieldRef from the pod
annotation ``fiar.io/fuse-allreduce-rms`` (``false``, or ``null``: vLLM's own setting). The token
that holds it always has text around it, so it never expands to an empty argument.

vLLM gathers every dotted ``-cc.*`` flag into one JSON that it appends at the end, and that JSON
*replaces* an earlier JSON ``--compilation-config`` (both store to one destination;
``vllm/utils/argparse_utils.py``, 0.25-0.33). So the reference goes where the container's own
compilation config already is:

- dotted ``-cc.*`` flags, or none at all: one more dotted flag, appended;
- a JSON ``--compilation-config`` / ``-cc`` (the last one, which is the one vLLM uses): the same JSON
  with ``pass_config.fuse_allreduce_rms`` set to the reference, re-serialized (the user's keys kept).

``-O`` / ``--optimization-level`` is a separate flag in these versions and is never touched.

Command forms understood (``form``):

- ``vllm-serve``: ``[.../]vllm serve ...`` in command (+ args), exec form;
- ``api-server``: ``python[3[.x]] -m vllm.entrypoints.openai.api_server ...``, exec form;
- ``image-entrypoint``: args only, on an image named ``*/vllm-openai`` (whose entrypoint is vLLM's
  server);
- ``additional-args``: a shell script that runs ``vllm serve ... ${VLLM_ADDITIONAL_ARGS} $@`` (KServe
  LLMInferenceService): ``VLLM_ADDITIONAL_ARGS`` gets ``$(FIAR_VLLM_ARGS)``, or ``"${FIAR_VLLM_ARGS}"``
  where the script runs ``eval "exec vllm serve ... ${VLLM_ADDITIONAL_ARGS} $@"`` (eval parses the
  variable's text as shell: only a quoted reference keeps the value one argument), or the JSON in
  the args that become ``$@`` is merged;
- ``placeholder``: a command that already holds ``$(FIAR_VLLM_ARGS)`` or ``$(FIAR_FUSE_ALLREDUCE_RMS)``
  (a container fiar already changed), or a shell string that expands ``"${FIAR_VLLM_ARGS}"`` itself
  (the safe form for a shell string: the shell quotes the value, the kubelet does not touch it):
  nothing to change.

Anything else (another shell string, ``--config FILE`` whose YAML may hold a compilation config, a
JSON that is not an object, an abbreviated flag) is *not understood*: the command is left exactly
as it is, and ``reason`` says why (naming the entry the command itself spells). A container whose
image, command and args name no engine, or that runs only an engine's worker or router (``ray
start``, ``multi-node-serving.sh worker``, ``sglang_router``), is taken for something else
(``mentions_vllm`` False): not understood either, but not reported.
"""

from __future__ import annotations

import json
import os.path
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

import fiar_contract as contract
from fiar_operator.core import options

Form = Literal[
    "vllm-serve",
    "api-server",
    "image-entrypoint",
    "additional-args",
    "placeholder",
    "sglang-launch-server",
    "sglang-serve",
]

FUSE_KEY: Final = "fuse_allreduce_rms"
REF_FUSE: Final = f"$({contract.ENV_FUSE_ALLREDUCE_RMS})"
REF_ARGS: Final = f"$({contract.ENV_VLLM_ARGS})"
SHELL_REF_ARGS: Final = f'"${{{contract.ENV_VLLM_ARGS}}}"'
"""The placeholder for a shell string: the shell expands the variable inside double quotes, so its
value is one argument and is never parsed as shell text (the kubelet's ``$(FIAR_VLLM_ARGS)`` is
textual: the shell would parse whatever the value holds)."""
_SHELL_REFERENCE = re.compile(r"\$\{?" + contract.ENV_VLLM_ARGS + r"\b")
_EVAL = re.compile(r"\beval\b")
_VLLM_SERVE = re.compile(r"\bvllm serve\b")
_COMMAND_END = re.compile(r"[\n;&|]")
"""Where a shell's simple command ends, as far as ``_eval_runs_serve`` tells them apart."""
MAX_SCRIPT: Final = 65536
"""Longest ``sh -c`` script that is read (KServe's is under 2 KiB); a longer one is not understood."""
DOTTED_FLAG: Final = f"-cc.pass_config.{FUSE_KEY}={REF_FUSE}"
"""The one flag fiar adds; also the value of FIAR_VLLM_ARGS."""
ADDITIONAL_ARGS: Final = "VLLM_ADDITIONAL_ARGS"
API_SERVER_MODULE: Final = "vllm.entrypoints.openai.api_server"
CC_LONG: Final = "--compilation-config"
CC_SHORT: Final = "-cc"
MAX_JSON: Final = 16384
"""Longest user JSON compilation config that is merged; a longer one leaves the command alone."""
MAX_TOKENS: Final = 512
"""Most command + args elements that are read."""
_SENTINEL: Final = "\x00fiar\x00"
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_SHELLS: Final = frozenset({"sh", "bash", "dash", "ash", "zsh"})
_IMAGE_REPOSITORY = re.compile(r"(^|/)vllm-openai$")


@dataclass(frozen=True)
class CommandPlan:
    """How a container's command carries the fusion decision; ``form`` None: not understood."""

    form: Form | None
    reason: str = ""
    explicit: bool = False
    """The container sets pass_config.fuse_allreduce_rms itself (kept under respectExplicitFusion)."""
    command: tuple[str, ...] | None = None
    """The new command; None: unchanged."""
    args: tuple[str, ...] | None = None
    """The new args; None: unchanged."""
    additional_args: str | None = None
    """The new value of VLLM_ADDITIONAL_ARGS; None: unchanged."""
    mentions_vllm: bool = True
    """Whether the container runs an engine server fiar knows (vLLM or SGLang) as far as its image,
    command and args tell: one that names neither (a sidecar), or runs only an engine's worker or
    router (a Ray worker's ``ray start``, LeaderWorkerSet's ``multi-node-serving.sh worker``, SGLang's
    router), is not reported when its command is not understood."""
    engine: str = "vllm"
    """The ``Engine.name`` of the row that read the command."""

    @property
    def understood(self) -> bool:
        return self.form is not None


class EnvValue(NamedTuple):
    """A container's variable as its env list sets it."""

    present: bool
    value: str | None
    """Its plain value; None when it comes from valueFrom (or is absent)."""


class Merged(NamedTuple):
    """A user's JSON compilation config with fiar's reference merged in."""

    json: str | None
    """The merged JSON; None: not merged (``explicit``, or a ``problem``)."""
    explicit: bool = False
    """It sets pass_config.fuse_allreduce_rms itself, kept under respectExplicitFusion."""
    problem: str = ""


class Edit(NamedTuple):
    """An engine's arguments with fiar's reference in them."""

    tokens: list[str] | None
    """The new arguments; None: left as they were (``explicit``, or a ``problem``)."""
    explicit: bool = False
    """The user sets the fusion itself, kept under respectExplicitFusion."""
    problem: str = ""
    append: bool = False
    """vLLM: the caller appends the dotted flag (no JSON config to merge it into)."""


class Split(NamedTuple):
    """A new argv as the container's command and args; each None when unchanged."""

    command: tuple[str, ...] | None
    args: tuple[str, ...] | None


def _strings(value: Any) -> list[str] | None:
    if value is None:
        return []
    if isinstance(value, list) and len(value) <= MAX_TOKENS and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _env_value(env: Any, name: str) -> EnvValue:
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get("value")
            return EnvValue(True, str(value) if value is not None and not entry.get("valueFrom") else None)
    return EnvValue(False, None)


def _image_repository(image: str) -> str:
    image = image.split("@", 1)[0]
    slash = image.rfind("/")
    colon = image.rfind(":")
    return image[:colon] if colon > slash else image


def _flag_name(token: str) -> str:
    """The option name of a token (before ``=``), spelled as vLLM matches it (``_`` -> ``-`` in ``--`` names
    up to the first dot)."""
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        head, dot, tail = name[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail
    return name


@dataclass(frozen=True)
class _Scan:
    json_at: int | None = None
    """Index of the token holding the last JSON compilation config."""
    json_inline: bool = False
    """That token is ``--compilation-config=JSON`` (the JSON follows the ``=``)."""
    dotted: tuple[int, ...] = ()
    """Indexes of the dotted ``-cc.*`` tokens, and of their separate values."""
    dotted_fuse: tuple[int, ...] = ()
    """Indexes (flag and separate value) of dotted flags that set pass_config.fuse_allreduce_rms."""
    explicit: bool = False
    """A dotted flag sets fuse_allreduce_rms (alone, or inside a whole ``-cc.pass_config`` JSON)."""
    problem: str = ""


def _scan(tokens: Sequence[str]) -> _Scan:
    json_at: int | None = None
    inline = False
    dotted: list[int] = []
    fuse: list[int] = []
    whole = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = _flag_name(token)
        if name == "--config":
            return _Scan(problem="--config: its YAML file may hold a compilation config that fiar cannot merge")
        if name == "--":
            return _Scan(problem="a '--' separator among vLLM's arguments")
        if name in (CC_LONG, CC_SHORT):
            if "=" in token:
                json_at, inline = i, True
            elif i + 1 < len(tokens):
                json_at, inline = i + 1, False
                i += 1
            else:
                return _Scan(problem=f"{token} without a value")
        elif name.startswith((CC_LONG + ".", CC_SHORT + ".")):
            key = name.split(".", 1)[1]
            if "=" not in token and i + 1 >= len(tokens):
                return _Scan(problem=f"{token} without a value")
            span = [i] if "=" in token else [i, i + 1]
            value = token.split("=", 1)[1] if "=" in token else tokens[i + 1]
            dotted += span
            if key == f"pass_config.{FUSE_KEY}":
                fuse += span
            elif key == "pass_config" and FUSE_KEY in value:
                whole = True
            i = span[-1]
        elif name.startswith("--") and len(name) > 2 and CC_LONG.startswith(name):
            return _Scan(problem=f"{token}: an abbreviation of {CC_LONG}")
        i += 1
    return _Scan(json_at, inline, tuple(dotted), tuple(fuse), explicit=bool(fuse) or whole)


def _merge(raw: str, respect: bool) -> Merged:
    """A user's JSON compilation config with the fusion reference merged in."""
    if len(raw) > MAX_JSON:
        return Merged(None, problem=f"its JSON {CC_LONG} is over {MAX_JSON} characters")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return Merged(None, problem=f"its {CC_LONG} is not JSON")
    if not isinstance(doc, dict):
        return Merged(None, problem=f"its {CC_LONG} is not a JSON object")
    pass_config = doc.get("pass_config", {})
    if not isinstance(pass_config, dict):
        return Merged(None, problem=f"its {CC_LONG} has a pass_config that is not an object")
    if FUSE_KEY in pass_config and respect:
        return Merged(None, explicit=True)
    plain = json.dumps(doc, ensure_ascii=False)
    if json.dumps(_SENTINEL) in plain:
        return Merged(None, problem=f"its {CC_LONG} holds fiar's marker text")
    if "$(" in plain:
        # Written out again, an escaped ``\u0024(VAR)`` would become ``$(VAR)``, which the kubelet
        # expands (a Secret's value in argv and in vLLM's logged arguments).
        return Merged(None, problem=f"its {CC_LONG} holds '$(' once decoded, which the kubelet would expand")
    rest = {k: v for k, v in pass_config.items() if k != FUSE_KEY}
    merged = {**doc, "pass_config": {**rest, FUSE_KEY: _SENTINEL}}
    text = json.dumps(merged, separators=(",", ":"), ensure_ascii=False)
    return Merged(text.replace(json.dumps(_SENTINEL), REF_FUSE))


def _edit(tokens: list[str], respect: bool) -> Edit:
    """vLLM's arguments with the fusion reference: a JSON config is merged in place; otherwise the
    caller appends DOTTED_FLAG or its equivalent (``append``)."""
    scan = _scan(tokens)
    if scan.problem:
        return Edit(None, problem=scan.problem)
    if scan.dotted:
        if scan.explicit and respect:
            return Edit(None, explicit=True)
        # Dotted flags merge in order, so the appended one wins over a whole -cc.pass_config JSON.
        drop = set(scan.dotted_fuse)
        return Edit([t for i, t in enumerate(tokens) if i not in drop], append=True)
    if scan.json_at is not None:
        token = tokens[scan.json_at]
        prefix, raw = (token.split("=", 1)[0] + "=", token.split("=", 1)[1]) if scan.json_inline else ("", token)
        merged = _merge(raw, respect)
        if merged.json is None:
            return Edit(None, merged.explicit, merged.problem)
        out = list(tokens)
        out[scan.json_at] = prefix + merged.json
        return Edit(out)
    return Edit(list(tokens), append=True)


def _has_reference(texts: Sequence[str]) -> bool:
    return any(REF_FUSE in t or REF_ARGS in t for t in texts)


def _vllm_edit(tokens: list[str], respect: bool) -> Edit:
    """vLLM's arguments with the fusion reference (merged into a JSON config, or the dotted flag appended)."""
    edited = _edit(tokens, respect)
    if edited.tokens is None:
        return edited
    return Edit(edited.tokens + ([DOTTED_FLAG] if edited.append else []))


# -- SGLang -------------------------------------------------------------------------------------------
SGLANG_TOKEN: Final = f"$({contract.ENV_SGLANG_ARGS})"
"""The token fiar puts right after SGLang's entry; it expands to ``--`` + the pod's fiar.io/sglang-flag."""
SGLANG_VALUE: Final = f"--$({contract.ENV_SGLANG_FLAG})"
"""The value of FIAR_SGLANG_ARGS: never empty, whatever the annotation holds."""
SHELL_REF_SGLANG: Final = f'"${{{contract.ENV_SGLANG_ARGS}}}"'
SGLANG_DISABLE: Final = "--enforce-disable-flashinfer-allreduce-fusion"
SGLANG_BACKEND: Final = "--flashinfer-allreduce-fusion-backend"
SGLANG_ENABLE: Final = "--enable-flashinfer-allreduce-fusion"
"""Deprecated since 0.5.x: means ``--flashinfer-allreduce-fusion-backend=auto``."""
SGLANG_BACKENDS: Final = frozenset({"auto", "trtllm", "mnnvl", "cutedsl"})
"""The values 0.5.23 accepts for SGLANG_BACKEND (0.5.20 and older: without cutedsl)."""
_SGLANG_FUSION_FLAGS: Final = (SGLANG_DISABLE, SGLANG_BACKEND, SGLANG_ENABLE)
_SGLANG_ENTRY_AND_TOKEN = re.compile(r"(sglang\.launch_server|sglang serve)\s+" + re.escape(SHELL_REF_SGLANG))


def _sglang_edit(tokens: list[str], respect: bool) -> Edit:
    """SGLang's arguments with SGLANG_TOKEN before the user's options (theirs, after it, win over the
    default it may restate; after a leading model path, which ``sglang serve`` takes as positional);
    the user's own fusion options kept under ``respect``, else dropped.

    Left alone (problem): ``--config`` (its YAML may set the fusion), an abbreviation of a fusion option
    (SGLang's argparse accepts those), a backend value SGLang does not know, a backend together with
    the enforce-disable switch, an option without its value.
    """
    own: list[int] = []
    disable = backend = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        if name == "--config":
            return Edit(None, problem="--config: its YAML file may set SGLang's allreduce fusion")
        if name == "--":
            return Edit(None, problem="a '--' separator among SGLang's arguments")
        if name in _SGLANG_FUSION_FLAGS:
            own.append(i)
            if name == SGLANG_BACKEND:
                if not eq:
                    if i + 1 >= len(tokens):
                        return Edit(None, problem=f"{token} without a value")
                    i += 1
                    value = tokens[i]
                    own.append(i)
                if value not in SGLANG_BACKENDS:
                    return Edit(None, problem=f"{SGLANG_BACKEND} {value!r} is not a backend SGLang knows")
                backend = True
            elif name == SGLANG_DISABLE:
                disable = True
            else:
                backend = True
        elif name.startswith("--") and len(name) > 2 and any(f.startswith(name) for f in _SGLANG_FUSION_FLAGS):
            return Edit(None, problem=f"{token}: an abbreviation of an SGLang fusion option")
        i += 1
    if disable and backend:
        return Edit(None, problem=f"it sets both {SGLANG_DISABLE} and a backend")
    if own and respect:
        return Edit(None, explicit=True)
    dropped = set(own)
    kept = [t for j, t in enumerate(tokens) if j not in dropped]
    at = 1 if kept[:1] and not kept[0].startswith("-") else 0  # `sglang serve MODEL`: the model stays first
    return Edit([*kept[:at], SGLANG_TOKEN, *kept[at:]])


# -- the engines --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """How a command starts an engine's server: ``PROGRAM WORDS...`` or ``python[3[.x]] -m MODULE``."""

    form: Form
    program: str = ""
    words: tuple[str, ...] = ()
    module: str = ""
    spelling: re.Pattern[str] = field(init=False, repr=False, compare=False)
    """This entry as a shell script may spell it (``found_in``), compiled once."""

    def __post_init__(self) -> None:
        pattern = (r"\bpython[\d.]*\s+-m\s+" + re.escape(self.module)) if self.module else re.escape(self.text)
        object.__setattr__(self, "spelling", re.compile(pattern + r"\b"))

    def start(self, argv: Sequence[str]) -> int | None:
        """Where the engine's own arguments start in ``argv``, or None when ``argv`` is not this entry."""
        if not argv:
            return None
        program = os.path.basename(argv[0])
        if self.module:
            return 3 if _PYTHON.fullmatch(program) and list(argv[1:3]) == ["-m", self.module] else None
        return (
            1 + len(self.words)
            if program == self.program and tuple(argv[1 : 1 + len(self.words)]) == self.words
            else None
        )

    @property
    def text(self) -> str:
        return f"python -m {self.module}" if self.module else " ".join((self.program, *self.words))

    def found_in(self, script: str) -> str | None:
        """This entry as ``script`` spells it (for a hint), or None."""
        match = self.spelling.search(script)
        return match.group(0) if match else None


@dataclass(frozen=True)
class Engine:
    """One engine fiar makes read the fusion decision: a new engine is one row of ENGINES."""

    name: str
    label: str
    entries: tuple[Entry, ...]
    edit: Callable[[list[str], bool], Edit]
    """The engine's arguments with fiar's reference (respecting the user's own fusion setting or not)."""
    references: tuple[str, ...]
    """Texts in an exec command that mark a container fiar already changed."""
    shell_reference: re.Pattern[str]
    """A shell string that expands fiar's variable itself."""
    shell_placeholder: str
    """What a shell string puts after the entry."""
    explicit: str
    """What a container that sets the fusion itself sets (for the respectExplicitFusion warning)."""
    not_servers: tuple[re.Pattern[str], ...] = ()
    """Commands that name the engine but run no server of it: a worker or a router."""
    image: re.Pattern[str] | None = None
    """Image repositories whose entrypoint is the engine's server (args-only containers)."""
    placeholder_at: re.Pattern[str] | None = None
    """Where a shell placeholder must stand, if it must (SGLang: right after the entry)."""
    injected: tuple[str, ...] = ()
    """The variables its container reads from their pod annotations (``pods.INJECTED``), first in env."""
    values: tuple[tuple[str, str], ...] = ()
    """(name, value) of the variables that follow them (their values refer to the injected ones)."""
    standalone: bool = False
    """Its container also reads VLLM_ALLREDUCE_USE_FLASHINFER (vLLM's standalone FlashInfer allreduce)."""
    guards_itself: tuple[str, ...] = ()
    """Multicast-guard variables the engine sets off itself where they are unset: fiar injects none of
    them (an injected "unset" value would turn the engine's own off into the library's default)."""
    forces_multicast: tuple[str, ...] = ()
    """Its flags that set those variables on whatever the environment says (reported)."""


ENGINES: Final[tuple[Engine, ...]] = (
    Engine(
        name="vllm",
        label="vLLM",
        entries=(
            Entry("vllm-serve", program="vllm", words=("serve",)),
            Entry("api-server", module=API_SERVER_MODULE),
        ),
        edit=_vllm_edit,
        references=(REF_FUSE, REF_ARGS),
        shell_reference=_SHELL_REFERENCE,
        shell_placeholder=SHELL_REF_ARGS,
        explicit=FUSE_KEY,
        not_servers=(re.compile(r"\bmulti-node-serving\.sh\s+worker\b"), re.compile(r"\bray\s+start\b")),
        image=_IMAGE_REPOSITORY,
        injected=(contract.ENV_FUSE_ALLREDUCE_RMS,),
        values=((contract.ENV_VLLM_ARGS, DOTTED_FLAG),),
        standalone=True,
    ),
    Engine(
        name="sglang",
        label="SGLang",
        entries=(
            Entry("sglang-launch-server", module="sglang.launch_server"),
            Entry("sglang-serve", program="sglang", words=("serve",)),
        ),
        edit=_sglang_edit,
        references=(SGLANG_TOKEN,),
        shell_reference=re.compile(r"\$\{?" + contract.ENV_SGLANG_ARGS + r"\b"),
        shell_placeholder=SHELL_REF_SGLANG,
        explicit="its FlashInfer allreduce fusion options",
        not_servers=(re.compile(r"\bsglang_router\b"), re.compile(r"\bray\s+start\b")),
        placeholder_at=_SGLANG_ENTRY_AND_TOKEN,
        injected=(contract.ENV_SGLANG_FLAG,),
        values=((contract.ENV_SGLANG_ARGS, SGLANG_VALUE),),
        # sglang/srt/entrypoints/engine.py (0.5.23) _set_envs_and_config: NCCL_NVLS_ENABLE is set to
        # str(int(enable_nccl_nvls or enable_symm_mem)) when unset or when either flag is given.
        guards_itself=("NCCL_NVLS_ENABLE",),
        forces_multicast=("--enable-nccl-nvls", "--enable-symm-mem"),
    ),
)
ENGINE: Final = {engine.name: engine for engine in ENGINES}


def plan_command(container: Mapping[str, Any], respect_explicit: bool = True) -> CommandPlan:
    """How ``container`` is made to read the fusion decision (see the module docstring)."""
    command = _strings(container.get("command"))
    args = _strings(container.get("args"))
    if command is None or args is None:
        return CommandPlan(None, f"command and args must be lists of at most {MAX_TOKENS} strings")
    env = container.get("env")
    extra_present, extra = _env_value(env, ADDITIONAL_ARGS)
    argv = command + args
    for engine in ENGINES:
        if any(ref in t for ref in engine.references for t in argv):
            return CommandPlan("placeholder", engine=engine.name)
    if extra is not None and (REF_ARGS in extra or SHELL_REF_ARGS in extra):
        return CommandPlan("placeholder")
    image = str(container.get("image") or "")
    text = " ".join([image, *argv]).lower()
    named = [engine for engine in ENGINES if engine.name in text]
    if not named:
        labels = " nor ".join(engine.label for engine in ENGINES)
        return CommandPlan(None, f"neither its image nor its command names {labels}", mentions_vllm=False)
    first = named[0]
    if not command:
        for engine in named:
            if engine.image is not None and engine.image.search(_image_repository(image)):
                return _exec(engine, "image-entrypoint", command, args, 0, respect_explicit)
        return CommandPlan(
            None, f"no command, and the image's entrypoint is not known to be {first.label}'s server", engine=first.name
        )
    for engine in ENGINES:
        for entry in engine.entries:
            at = entry.start(argv)
            if at is not None:
                return _exec(engine, entry.form, command, args, at, respect_explicit)
    program = os.path.basename(argv[0])
    if program in _SHELLS and argv[1:2] == ["-c"] and len(argv) > 2:
        return _shell(named, command, args, extra_present, extra, respect_explicit)
    if any(pattern.search(" ".join(argv)) for engine in named for pattern in engine.not_servers):
        return CommandPlan(None, f"{program} runs no engine server", mentions_vllm=False, engine=first.name)
    entries = " nor ".join(f"'{entry.text}'" for entry in first.entries)
    return CommandPlan(None, f"{program} is neither {entries}", engine=first.name)


def _shell(
    named: list[Engine], command: list[str], args: list[str], present: bool, extra: str | None, respect: bool
) -> CommandPlan:
    """A ``sh -c SCRIPT`` command: fiar's placeholder in it, KServe's VLLM_ADDITIONAL_ARGS, or a hint."""
    script = (command + args)[2]
    if len(script) > MAX_SCRIPT:
        return CommandPlan(None, f"a shell command of {len(script)} characters (fiar reads at most {MAX_SCRIPT})")
    for engine in named:
        if engine.shell_reference.search(script):
            if engine.placeholder_at is not None and not engine.placeholder_at.search(script):
                return CommandPlan(
                    None,
                    f"a shell command: {engine.shell_placeholder} must follow '{engine.entries[0].text}' directly",
                    engine=engine.name,
                )
            return CommandPlan("placeholder", engine=engine.name)
    if ADDITIONAL_ARGS in script and "vllm serve" in script:
        return _additional(command, args, present, extra, script, respect)
    for engine in named:
        for entry in engine.entries:
            spelled = entry.found_in(script)
            if spelled:
                return CommandPlan(
                    None, f"a shell command: put {engine.shell_placeholder} after '{spelled}' in it", engine=engine.name
                )
    for engine in named:
        if any(pattern.search(script) for pattern in engine.not_servers):
            return CommandPlan(None, "its shell command runs no engine server", mentions_vllm=False, engine=engine.name)
    first = named[0]
    return CommandPlan(
        None, f"a shell command: put {first.shell_placeholder} after '{first.entries[0].text}' in it", engine=first.name
    )


def _exec(engine: Engine, form: Form, command: list[str], args: list[str], start: int, respect: bool) -> CommandPlan:
    """An exec-form command whose engine arguments start at ``start`` of command + args."""
    argv = command + args
    edited = engine.edit(argv[start:], respect)
    if edited.tokens is None:
        return CommandPlan(None if not edited.explicit else form, edited.problem, edited.explicit, engine=engine.name)
    if engine.name == "sglang":
        split = _split_inserted(argv[:start], edited.tokens, command, args)
    else:
        split = _split(argv[:start] + edited.tokens, command, args)
    return CommandPlan(form, command=split.command, args=split.args, engine=engine.name)


def _split_inserted(head: list[str], tokens: list[str], command: list[str], args: list[str]) -> Split:
    """As ``_split``, for ``tokens`` holding fiar's SGLANG_TOKEN: it is inserted into the command when
    its place is inside the command, else into args (the other tokens stay where they were)."""
    at = len(head) + tokens.index(SGLANG_TOKEN)
    rest = _split(head + [t for t in tokens if t != SGLANG_TOKEN], command, args)
    new_command = list(rest.command if rest.command is not None else command)
    new_args = list(rest.args if rest.args is not None else args)
    if at < len(new_command):
        new_command.insert(at, SGLANG_TOKEN)
    else:
        new_args.insert(at - len(new_command), SGLANG_TOKEN)
    return Split(None if new_command == command else tuple(new_command), None if new_args == args else tuple(new_args))


def _split(new: list[str], command: list[str], args: list[str]) -> Split:
    """New argv as command and args: command keeps its length, so an appended flag lands in args (and
    a token merged or dropped stays where it was)."""
    head, tail = new[: len(command)], new[len(command) :]
    return Split(None if head == command else tuple(head), None if tail == args else tuple(tail))


def _eval_runs_serve(script: str) -> bool:
    """Whether an ``eval`` word and a later ``vllm serve`` stand in one simple command of ``script`` (no
    newline, ``;``, ``&`` or ``|`` between them).

    One pass over each command, not a pattern ``eval[^;...]*vllm serve``: that one backtracks from every
    ``eval`` to the command's end, quadratic in a script of many ``eval`` words (a 128 KiB script held
    the interpreter 32 s). The first ``eval`` of a command is the one to look behind: any later one's
    ``vllm serve`` follows it too."""
    for simple in _COMMAND_END.split(script):
        found = _EVAL.search(simple)
        if found is not None and _VLLM_SERVE.search(simple, found.end()) is not None:
            return True
    return False


def _additional(
    command: list[str], args: list[str], present: bool, extra: str | None, script: str, respect: bool
) -> CommandPlan:
    """KServe LLMInferenceService: ``bash -c '... vllm serve ... ${VLLM_ADDITIONAL_ARGS} $@' -- ARGS``."""
    if CC_SHORT + "." in script or CC_LONG in script or "--config" in script:
        return CommandPlan(None, "its shell script passes a compilation config or config file itself")
    if present and extra is None:
        return CommandPlan(None, f"{ADDITIONAL_ARGS} comes from valueFrom; fiar cannot append to it")
    if extra is not None and (CC_SHORT in extra or "compilation" in extra or "--config" in extra):
        return CommandPlan(None, f"{ADDITIONAL_ARGS} holds a compilation config or config file")
    evaluated = _eval_runs_serve(script)
    if not evaluated and _EVAL.search(script):
        return CommandPlan(None, f"its shell script runs eval elsewhere than on 'vllm serve' with {ADDITIONAL_ARGS}")
    argv = command + args
    start = 4 if len(argv) >= 4 else len(argv)  # [shell, -c, script, $0, $@...]
    edited = _edit(argv[start:], respect)
    if edited.tokens is None:
        return CommandPlan(None if not edited.explicit else "additional-args", edited.problem, edited.explicit)
    split = Split(None, None) if edited.tokens == argv[start:] else _split(argv[:start] + edited.tokens, command, args)
    # Under eval the shell parses VLLM_ADDITIONAL_ARGS as shell text: it gets the quoted shell reference,
    # so that the value is expanded once, as one argument. Without eval its text is only split into
    # words, and the kubelet's expansion is safe.
    ref = SHELL_REF_ARGS if evaluated else REF_ARGS
    value = (f"{extra} {ref}".strip() if extra else ref) if edited.append else None
    return CommandPlan("additional-args", command=split.command, args=split.args, additional_args=value)


# -- options the decision reads (``options``) ---------------------------------------------------------
MAX_OPTION_SCRIPT: Final = 16384
"""Longest shell string whose vLLM options are read; a longer one's are unreadable."""
_SHELL_OPERATORS: Final = frozenset({";", "&&", "||", "|", "&", "\n"})


def _script_arguments(script: str) -> list[str] | None:
    """The arguments after ``vllm serve`` in a shell string, split as the shell would split its words
    (up to the next operator); None where it cannot be split."""
    if len(script) > MAX_OPTION_SCRIPT:
        return None
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return None
    if len(words) > MAX_TOKENS:
        return None
    for i in range(len(words) - 1):
        entry = (os.path.basename(words[i]), words[i + 1])
        if entry == ("vllm", "serve") or entry == ("-m", API_SERVER_MODULE):
            rest = words[i + 2 :]
            end = next((j for j, w in enumerate(rest) if w in _SHELL_OPERATORS), len(rest))
            return rest[:end]
    return []


def vllm_options(container: Mapping[str, Any]) -> options.Options | None:
    """The options of ``options.BREAKS`` that a container's vLLM command sets (None: the container runs
    no vLLM server fiar knows). Read in every form ``plan_command`` reads; a shell string is split as
    the shell splits words, with KServe's ``VLLM_ADDITIONAL_ARGS`` and the script's ``$@`` appended."""
    command = _strings(container.get("command"))
    args = _strings(container.get("args"))
    if command is None or args is None:
        return None
    argv = command + args
    image = str(container.get("image") or "")
    if not command:
        engine = ENGINE["vllm"]
        if engine.image is not None and engine.image.search(_image_repository(image)):
            return options.read_vllm(args)
        return None
    for entry in ENGINE["vllm"].entries:
        at = entry.start(argv)
        if at is not None:
            return options.read_vllm(argv[at:])
    if os.path.basename(argv[0]) in _SHELLS and argv[1:2] == ["-c"] and len(argv) > 2:
        script = argv[2]
        if "vllm serve" not in script and API_SERVER_MODULE not in script:
            return None
        words = _script_arguments(script)
        if words is None:
            return options.unreadable("in a shell string fiar cannot split")
        _, extra = _env_value(container.get("env"), ADDITIONAL_ARGS)
        if ADDITIONAL_ARGS in script:
            extra_words = _script_arguments("vllm serve " + (extra or ""))
            if extra_words is None:
                return options.unreadable(f"in {ADDITIONAL_ARGS}, which fiar cannot split")
            words = [w for w in words if ADDITIONAL_ARGS not in w and w not in ("$@", "$*")]
            words += extra_words + argv[4:]
        return options.read_vllm(words)
    return None
