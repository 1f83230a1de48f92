"""How a vLLM container's command is made to read fiar's fusion decision: pure functions.

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
as it is, and ``reason`` says why. A container whose image, command and args do not name vLLM at all
is taken for a sidecar (``mentions_vllm`` False): not understood either, but not reported.
"""

from __future__ import annotations

import json
import os.path
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import fiar_contract as contract

Form = Literal["vllm-serve", "api-server", "image-entrypoint", "additional-args", "placeholder"]

FUSE_KEY: Final = "fuse_allreduce_rms"
REF_FUSE: Final = f"$({contract.ENV_FUSE_ALLREDUCE_RMS})"
REF_ARGS: Final = f"$({contract.ENV_VLLM_ARGS})"
SHELL_REF_ARGS: Final = f'"${{{contract.ENV_VLLM_ARGS}}}"'
"""The placeholder for a shell string: the shell expands the variable inside double quotes, so its
value is one argument and is never parsed as shell text (the kubelet's ``$(FIAR_VLLM_ARGS)`` is
textual: the shell would parse whatever the value holds)."""
_SHELL_REFERENCE = re.compile(r"\$\{?" + contract.ENV_VLLM_ARGS + r"\b")
_EVAL_SERVE = re.compile(r"\beval\b[^\n;&|]*\bvllm serve\b")
_EVAL = re.compile(r"\beval\b")
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
    """Whether the image, command or args name vLLM at all: a container that does not (a sidecar, a Ray
    worker's ``ray start``) is not reported when its command is not understood."""

    @property
    def understood(self) -> bool:
        return self.form is not None


def _strings(value: Any) -> list[str] | None:
    if value is None:
        return []
    if isinstance(value, list) and len(value) <= MAX_TOKENS and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _env_value(env: Any, name: str) -> tuple[bool, str | None]:
    """(present, plain value) of a variable; value None when it comes from valueFrom."""
    for entry in env if isinstance(env, list) else []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get("value")
            return True, (str(value) if value is not None and not entry.get("valueFrom") else None)
    return False, None


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


def _merge(raw: str, respect: bool) -> tuple[str | None, bool, str]:
    """(merged JSON, explicit, problem) for a user's JSON compilation config."""
    if len(raw) > MAX_JSON:
        return None, False, f"its JSON {CC_LONG} is over {MAX_JSON} characters"
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None, False, f"its {CC_LONG} is not JSON"
    if not isinstance(doc, dict):
        return None, False, f"its {CC_LONG} is not a JSON object"
    pass_config = doc.get("pass_config", {})
    if not isinstance(pass_config, dict):
        return None, False, f"its {CC_LONG} has a pass_config that is not an object"
    if FUSE_KEY in pass_config and respect:
        return None, True, ""
    plain = json.dumps(doc, ensure_ascii=False)
    if json.dumps(_SENTINEL) in plain:
        return None, False, f"its {CC_LONG} holds fiar's marker text"
    if "$(" in plain:
        # Written out again, an escaped ``\u0024(VAR)`` would become ``$(VAR)``, which the kubelet
        # expands (a Secret's value in argv and in vLLM's logged arguments).
        return None, False, f"its {CC_LONG} holds '$(' once decoded, which the kubelet would expand"
    rest = {k: v for k, v in pass_config.items() if k != FUSE_KEY}
    merged = {**doc, "pass_config": {**rest, FUSE_KEY: _SENTINEL}}
    text = json.dumps(merged, separators=(",", ":"), ensure_ascii=False)
    return text.replace(json.dumps(_SENTINEL), REF_FUSE), False, ""


def _edit(tokens: list[str], respect: bool) -> tuple[list[str] | None, bool, str, bool]:
    """(new vLLM tokens or None, explicit, problem, needs the dotted flag appended) for vLLM's arguments.

    A JSON config is merged in place; otherwise the caller appends DOTTED_FLAG (or its equivalent).
    """
    scan = _scan(tokens)
    if scan.problem:
        return None, False, scan.problem, False
    if scan.dotted:
        if scan.explicit and respect:
            return None, True, "", False
        # Dotted flags merge in order, so the appended one wins over a whole -cc.pass_config JSON.
        drop = set(scan.dotted_fuse)
        return [t for i, t in enumerate(tokens) if i not in drop], False, "", True
    if scan.json_at is not None:
        token = tokens[scan.json_at]
        prefix, raw = (token.split("=", 1)[0] + "=", token.split("=", 1)[1]) if scan.json_inline else ("", token)
        merged, explicit, problem = _merge(raw, respect)
        if merged is None:
            return None, explicit, problem, False
        out = list(tokens)
        out[scan.json_at] = prefix + merged
        return out, False, "", False
    return list(tokens), False, "", True


def _has_reference(texts: Sequence[str]) -> bool:
    return any(REF_FUSE in t or REF_ARGS in t for t in texts)


def plan_command(container: Mapping[str, Any], respect_explicit: bool = True) -> CommandPlan:
    """How ``container`` is made to read the fusion decision (see the module docstring)."""
    command = _strings(container.get("command"))
    args = _strings(container.get("args"))
    if command is None or args is None:
        return CommandPlan(None, f"command and args must be lists of at most {MAX_TOKENS} strings")
    env = container.get("env")
    extra_present, extra = _env_value(env, ADDITIONAL_ARGS)
    if _has_reference(command + args) or (extra is not None and (REF_ARGS in extra or SHELL_REF_ARGS in extra)):
        return CommandPlan("placeholder")
    argv = command + args
    if not any("vllm" in text.lower() for text in [str(container.get("image") or ""), *argv]):
        return CommandPlan(None, "neither its image nor its command names vLLM", mentions_vllm=False)
    if not command:
        if not _IMAGE_REPOSITORY.search(_image_repository(str(container.get("image") or ""))):
            return CommandPlan(None, "no command, and the image's entrypoint is not known to be vLLM's server")
        return _exec("image-entrypoint", command, args, 0, respect_explicit)
    program = os.path.basename(argv[0])
    if program == "vllm" and argv[1:2] == ["serve"]:
        return _exec("vllm-serve", command, args, 2, respect_explicit)
    if _PYTHON.fullmatch(program) and argv[1:3] == ["-m", API_SERVER_MODULE]:
        return _exec("api-server", command, args, 3, respect_explicit)
    if program in _SHELLS and argv[1:2] == ["-c"] and len(argv) > 2:
        script = argv[2]
        if _SHELL_REFERENCE.search(script):
            return CommandPlan("placeholder")
        if ADDITIONAL_ARGS in script and "vllm serve" in script:
            return _additional(command, args, extra_present, extra, script, respect_explicit)
        return CommandPlan(None, f"a shell command: put {SHELL_REF_ARGS} after 'vllm serve' in it")
    return CommandPlan(None, f"{program} is neither 'vllm serve' nor 'python -m {API_SERVER_MODULE}'")


def _exec(form: Form, command: list[str], args: list[str], start: int, respect: bool) -> CommandPlan:
    """An exec-form command whose vLLM arguments start at ``start`` of command + args."""
    argv = command + args
    tokens, explicit, problem, append = _edit(argv[start:], respect)
    if tokens is None:
        return CommandPlan(None if not explicit else form, problem, explicit)
    new = argv[:start] + tokens + ([DOTTED_FLAG] if append else [])
    new_command, new_args = _split(new, command, args)
    return CommandPlan(form, command=new_command, args=new_args)


def _split(
    new: list[str], command: list[str], args: list[str]
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """New argv as (command, args), each None when unchanged: command keeps its length, so an appended
    flag lands in args (and a token merged or dropped stays where it was)."""
    head, tail = new[: len(command)], new[len(command) :]
    return (None if head == command else tuple(head)), (None if tail == args else tuple(tail))


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
    evaluated = bool(_EVAL_SERVE.search(script))
    if not evaluated and _EVAL.search(script):
        return CommandPlan(None, f"its shell script runs eval elsewhere than on 'vllm serve' with {ADDITIONAL_ARGS}")
    argv = command + args
    start = 4 if len(argv) >= 4 else len(argv)  # [shell, -c, script, $0, $@...]
    tokens, explicit, problem, append = _edit(argv[start:], respect)
    if tokens is None:
        return CommandPlan(None if not explicit else "additional-args", problem, explicit)
    new_command, new_args = (None, None) if tokens == argv[start:] else _split(argv[:start] + tokens, command, args)
    # Under eval the shell parses VLLM_ADDITIONAL_ARGS as shell text: it gets the quoted shell reference,
    # so that the value is expanded once, as one argument. Without eval its text is only split into
    # words, and the kubelet's expansion is safe.
    ref = SHELL_REF_ARGS if evaluated else REF_ARGS
    value = (f"{extra} {ref}".strip() if extra else ref) if append else None
    return CommandPlan("additional-args", command=new_command, args=new_args, additional_args=value)


# -- what the kubelet makes of it ---------------------------------------------------------------------
def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` expansion as the kubelet does it in env values, command and args
    (k8s.io/kubernetes third_party/forked/golang/expansion): a defined variable is replaced, an undefined
    reference is kept as written, ``$$`` gives ``$``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            following = text[i + 1]
            if following == "$":
                out.append("$")
                i += 2
                continue
            if following == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_process(pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """(argv after expansion, environment) of ``container`` as the kubelet starts it: env entries in order,
    a fieldRef to an annotation the pod lacks gives "", a value expands the variables defined before it;
    command and args expand against the whole environment. (The image's entrypoint, for args only, is
    not part of argv.)"""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = str(entry["name"])
        path = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if path is not None:
            key = str(path).removeprefix("metadata.annotations['").removesuffix("']")
            env[name] = str(annotations.get(key, ""))
        else:
            env[name] = expand(str(entry.get("value") or ""), env)
    argv = [expand(str(t), env) for t in (container.get("command") or []) + (container.get("args") or [])]
    return argv, env
