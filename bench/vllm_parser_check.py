"""fiar's fusion mechanism checked against vLLM's own argument parser and config objects.

For each command form (production-stack ``vllm serve``, KServe ``python -m
vllm.entrypoints.openai.api_server``, args on the ``vllm/vllm-openai`` image, KServe
LLMInferenceService's ``VLLM_ADDITIONAL_ARGS``, an LWS-style ``sh -c`` with the placeholder, a user's
JSON and dotted ``--compilation-config``) and each node verdict, this script

1. lets fiar's pod webhook mutate the container (``plan_pod_create``) and its binding decision
   annotate the pod (``decide`` + ``Decision.annotations``), exactly as the operator does;
2. resolves env and ``$(VAR)`` as the kubelet does (``devcluster.kubelet.container_process``), then runs shell
   forms through a real ``sh``/``bash`` with a stand-in ``vllm`` executable that records its argv, so
   word splitting, ``eval`` and ``$@`` are the shell's own;
3. feeds that argv and env, in a throwaway venv per vLLM version, to vLLM's own parser
   (``FlexibleArgumentParser`` + ``make_arg_parser``, the ``serve`` subcommand for ``vllm serve``),
   ``AsyncEngineArgs.from_cli_args`` (vLLM's CompilationConfig object) and ``vllm.envs``, and checks
   ``pass_config.fuse_allreduce_rms``, that both variables are accepted, and that the user's own
   settings survive. Two controls show what fiar avoids: an empty value raises, and a dotted flag
   appended after a user's JSON ``--compilation-config`` replaces it.

The venvs live outside the repository (``~/.cache/fiar/vllm-check``, override with
``FIAR_VLLM_CHECK_DIR``): one base venv has the newest checked vLLM with its dependencies (torch
included, no GPU needed); each version's venv has only its vLLM wheel (``--no-deps``) and reads the
base's packages through a ``.pth`` file. Needs about 12 GB of disk and PyPI.

    .venv/bin/python bench/vllm_parser_check.py [--versions 0.25.1,0.27.1,0.32.0,0.33.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import fiar_contract as contract
from devcluster.kubelet import container_process
from fiar_operator.admission.mutation import plan_pod_create
from fiar_operator.core import decide, patches
from fiar_operator.core.policy import parse_policy

VERSIONS = ("0.25.1", "0.27.1", "0.32.0", "0.33.0", "0.34.0")
BASE_VERSION = "0.34.0"
PIN_STAND_INS = {"flashinfer-python==0.7.3": "flashinfer-python==0.7.4"}
"""Pins of the base release the registry does not serve -> what the base venv installs instead."""
CACHE = Path(os.environ.get("FIAR_VLLM_CHECK_DIR", Path.home() / ".cache" / "fiar" / "vllm-check"))
USER_JSON = {"cudagraph_capture_sizes": [1, 2, 4], "pass_config": {"fuse_norm_quant": True}}

NODES = {
    # node verdict -> labels (the agent's, see tests/node_agent/pure/test_verdict_over_fixtures.py)
    "mnnvl": {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass"},
    "trtllm": {contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass"},
    "none (trtllm ran)": {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "pass"},
    "none": {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "fail"},
}

FORMS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (entry vLLM parses with, container, user settings that must survive: dotted path -> value)
    "production-stack": (
        "serve",
        {
            "name": "vllm",
            "image": "lmcache/vllm-openai:latest",
            "command": ["/opt/venv/bin/vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000", "-O3"],
            "args": ["--tensor-parallel-size", "2"],
        },
        {"optimization_level": "3", "tensor_parallel_size": 2},
    ),
    "kserve-api-server": (
        "api_server",
        {
            "name": "kserve-container",
            "image": "kserve/vllmserver:latest",
            "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
            "args": ["--port=8080", "--served-model-name=m", "--model=/mnt/models"],
        },
        {"served_model_name": ["m"]},
    ),
    "image-entrypoint": (
        "serve",
        {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "args": ["m", "--tensor-parallel-size", "8"]},
        {"tensor_parallel_size": 8},
    ),
    "llmisvc-additional-args": (
        "serve",
        {
            "name": "main",
            "image": "ghcr.io/llm-d/llm-d:v0.4",
            "command": [
                "/bin/bash",
                "-c",
                'eval "exec vllm serve /mnt/models --port 8000 ${VLLM_ADDITIONAL_ARGS} $@"',
                "--",
            ],
            "args": ["--max-model-len=4096"],
            "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": "--enable-prefix-caching"}],
        },
        {"max_model_len": 4096, "enable_prefix_caching": True},
    ),
    "lws-sh-placeholder": (
        "serve",
        {
            "name": "vllm-leader",
            "image": "vllm/vllm-openai:latest",
            "command": ["sh", "-c", "vllm serve m --tensor-parallel-size 8 $(FIAR_VLLM_ARGS) && true"],
        },
        {"tensor_parallel_size": 8},
    ),
    "user-json": (
        "serve",
        {
            "name": "vllm",
            "image": "vllm/vllm-openai:latest",
            "command": ["vllm", "serve", "m", "--compilation-config", json.dumps(USER_JSON)],
        },
        {
            "compilation_config.cudagraph_capture_sizes": [1, 2, 4],
            "compilation_config.pass_config.fuse_norm_quant": True,
        },
    ),
    "user-json-kserve": (
        "api_server",
        {
            "name": "kserve-container",
            "image": "kserve/vllmserver:latest",
            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "args": ["--model=/mnt/models", f"--compilation_config={json.dumps(USER_JSON)}"],
        },
        {
            "compilation_config.cudagraph_capture_sizes": [1, 2, 4],
            "compilation_config.pass_config.fuse_norm_quant": True,
        },
    ),
    "user-dotted": (
        "serve",
        {
            "name": "vllm",
            "image": "vllm/vllm-openai:latest",
            "command": ["vllm", "serve", "m", "-cc.max_cudagraph_capture_size=64"],
        },
        {"compilation_config.max_cudagraph_capture_size": 64},
    ),
}

FAKE_VLLM = """#!/bin/sh
exec "$FIAR_PYTHON" -c 'import json, os, sys
open(os.environ["FIAR_ARGV_OUT"], "w").write(json.dumps(sys.argv[1:]))' "$@"
"""


def _shell_argv(argv: list[str], env: dict[str, str], program: str = "vllm") -> list[str]:
    """The argv the ``program`` executable gets when the shell runs ``argv`` (a real sh/bash does the work)."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / program
        fake.write_text(FAKE_VLLM)
        fake.chmod(0o755)
        out = Path(tmp) / "argv.json"
        run_env = {
            **env,
            "PATH": f"{tmp}:/usr/bin:/bin",
            "FIAR_PYTHON": sys.executable,
            "FIAR_ARGV_OUT": str(out),
        }
        subprocess.run([os.path.basename(argv[0]), *argv[1:]], env=run_env, check=True, timeout=30)
        recorded: list[str] = json.loads(out.read_text())
        return recorded


def vllm_tokens(entry: str, container: dict[str, Any], argv: list[str], env: dict[str, str]) -> list[str]:
    """The arguments after ``vllm serve`` / after the api_server module, as the process gets them."""
    if not container.get("command"):  # args only: the image's entrypoint is `vllm serve`
        return argv
    program = os.path.basename(argv[0])
    if program in ("sh", "bash"):
        recorded = _shell_argv(argv, env)
        return recorded[1:]  # drop "serve"
    if entry == "serve":
        return argv[2:]
    return argv[3:]


def cases() -> list[dict[str, Any]]:
    policy = parse_policy({"metadata": {"name": "vllm"}, "spec": {"podSelector": {}}})
    found = []
    for form, (entry, container, user) in FORMS.items():
        source = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [copy.deepcopy(container)]}}
        plan = plan_pod_create(source, policy, {})
        pod = patches.apply(copy.deepcopy(source), plan.ops)
        for verdict, labels in NODES.items():
            decision = decide.decide(policy, "gpu-1", labels)
            bound = copy.deepcopy(pod)
            bound["metadata"]["annotations"].update(decision.annotations())
            mutated = bound["spec"]["containers"][0]
            argv, env = container_process(bound, mutated)
            tokens = vllm_tokens(entry, mutated, argv, env)
            found.append(
                {
                    "form": form,
                    "verdict": verdict,
                    "entry": entry,
                    "tokens": tokens,
                    "env": {k: v for k, v in env.items() if k.startswith("VLLM_")},
                    "expect_fuse": {"on": None, "off": False}[decision.fusion],
                    "expect_backend": decision.backend,
                    "expect_use": decision.flashinfer_allreduce,
                    "user": user,
                }
            )
    # Controls: what fiar avoids.
    found.append(
        {
            "form": "control: dotted flag appended after a user JSON",
            "verdict": "-",
            "entry": "serve",
            "tokens": ["m", "--compilation-config", json.dumps(USER_JSON), "-cc.pass_config.fuse_allreduce_rms=false"],
            "env": {},
            "expect_fuse": False,
            "expect_backend": "auto",
            "expect_use": None,
            "user": {"compilation_config.cudagraph_capture_sizes": [1, 2, 4]},
            "expect_user_lost": True,
        }
    )
    for name in (contract.ENV_VAR, contract.ENV_ALLREDUCE_USE_FLASHINFER):
        found.append(
            {
                "form": f"control: empty {name}",
                "verdict": "-",
                "entry": "serve",
                "tokens": ["m"],
                "env": {name: ""},
                "expect_error": "ValueError",
                "user": {},
            }
        )
    return found


CHECKER = r"""
import json, os, sys, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
cases = json.load(sys.stdin)
import vllm
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
# No GPU here, and releases before 0.33 take the CPU platform only in a CPU build: set it, as
# VLLM_TARGET_DEVICE=cpu does in 0.33. Parsing and CompilationConfig do not depend on it.
vllm.platforms._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:  # where `vllm serve` and the api_server module take their parser from, by release
    from vllm.entrypoints.openai.cli_args import make_arg_parser  # 0.25-0.27
except ImportError:
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.32
    except ImportError:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs
import vllm.envs as envs

def plain(value):
    if hasattr(value, "name") and hasattr(value, "value") and not isinstance(value, (int, str)):
        return value.name
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)

def get(obj, path):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part)
    return plain(obj)

results = []
keys = ("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "VLLM_ALLREDUCE_USE_FLASHINFER")
for case in cases:
    for key in keys:
        os.environ.pop(key, None)
    os.environ.update(case["env"])
    result = {"form": case["form"], "verdict": case["verdict"]}
    try:
        backend = envs.VLLM_FLASHINFER_ALLREDUCE_BACKEND
        use = envs.VLLM_ALLREDUCE_USE_FLASHINFER
        if case["entry"] == "serve":
            parser = FlexibleArgumentParser()
            ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
            args = parser.parse_args(["serve", *case["tokens"]])
        else:
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(case["tokens"])
        engine = AsyncEngineArgs.from_cli_args(args)
        result.update(
            fuse=plain(engine.compilation_config.pass_config.fuse_allreduce_rms),
            backend=backend,
            use=use,
            user={p: get(engine if p.startswith("compilation_config") else args, p) for p in case["user"]},
        )
    except BaseException as exc:
        result["error"] = type(exc).__name__
        result["message"] = str(exc)[:300]
    results.append(result)
print(json.dumps({"version": vllm.__version__, "results": results}))
"""


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kw)


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


WHEELS = Path(os.environ.get("FIAR_WHEEL_CACHE", Path.home() / ".cache" / "fiar" / "wheels"))
"""Downloaded engine wheels (``pip download --no-deps``), shared with ``bench/engine_release.py``."""


def _wheel(version: str) -> Path:
    found = next(WHEELS.glob(f"vllm-{version}-*.whl"), None)
    if found is None:
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}", "-d", str(WHEELS)])
        found = next(WHEELS.glob(f"vllm-{version}-*.whl"))
    return found


def _requirements(wheel: Path) -> list[str]:
    """The unconditional requirements of a wheel (its METADATA's Requires-Dist without an extra)."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    return [line.split(": ", 1)[1] for line in lines if line.startswith("Requires-Dist: ") and "extra ==" not in line]


def prepare(version: str) -> Path:
    """A venv with vLLM ``version`` (no deps) over the base venv's packages; made once."""
    base = CACHE / "base"
    if not (base / ".ready").exists():
        _run([sys.executable, "-m", "venv", str(base)])
        wheel = _wheel(BASE_VERSION)
        requirements = base / "requirements.txt"
        requirements.write_text("".join(f"{PIN_STAND_INS.get(r, r)}\n" for r in _requirements(wheel)))
        _run([str(base / "bin" / "pip"), "install", "-q", "-r", str(requirements)])
        _run([str(base / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)])
        (base / ".ready").write_text(BASE_VERSION)
    venv = CACHE / f"vllm-{version}"
    if not (venv / ".ready").exists():
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(_wheel(version))])
        # addsitedir, not a bare path: the base's own .pth files (nvidia-cutlass-dsl's) are read too.
        below = str(_site_packages(base))
        (_site_packages(venv) / "fiar-base.pth").write_text(f"import site; site.addsitedir({below!r})\n")
        (venv / ".ready").write_text(version)
    return venv


def run_in_venv(
    venv: Path, args: list[str], payload: Any, drop: tuple[str, ...], timeout: float, **env: str
) -> dict[str, Any]:
    """Run ``python args`` in ``venv`` with ``payload`` as JSON on stdin, no GPU, none of the variables
    that start with ``drop``, and ``env`` added; its last line of stdout, read as JSON."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    full.update(CUDA_VISIBLE_DEVICES="", **env)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), *args],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"checker failed in {venv}:\n{proc.stderr[-4000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def check(venv: Path, found: list[dict[str, Any]]) -> dict[str, Any]:
    # No GPU here: vLLM's config classes need a platform to build the parser, so take its CPU platform.
    # Argument parsing, the dotted -cc merge and CompilationConfig do not depend on it.
    return run_in_venv(venv, ["-c", CHECKER], found, ("VLLM_",), 900, VLLM_TARGET_DEVICE="cpu")


def verdicts(found: list[dict[str, Any]], doc: dict[str, Any]) -> list[tuple[str, str, bool, str]]:
    """(form, node verdict, ok, what) for each case."""
    rows = []
    for case, result in zip(found, doc["results"], strict=True):
        if "expect_error" in case:
            ok = result.get("error") == case["expect_error"]
            rows.append((case["form"], case["verdict"], ok, result.get("error") or "accepted"))
            continue
        if "error" in result:
            rows.append((case["form"], case["verdict"], False, f"{result['error']}: {result['message']}"))
            continue
        kept = all(result["user"].get(p) == v for p, v in case["user"].items())
        if case.get("expect_user_lost"):
            ok = result["fuse"] is False and not kept
            rows.append((case["form"], case["verdict"], ok, f"user JSON kept: {kept}"))
            continue
        ok = (
            result["fuse"] == case["expect_fuse"]
            and result["backend"] == case["expect_backend"]
            and result["use"] == case["expect_use"]
            and kept
        )
        what = f"fuse_allreduce_rms={result['fuse']} backend={result['backend']} use_flashinfer={result['use']}"
        if not kept:
            what += f" user settings {result['user']} != {case['user']}"
        rows.append((case["form"], case["verdict"], ok, what))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    opts = parser.parse_args()
    found = cases()
    report: dict[str, Any] = {"cases": found, "versions": {}}
    failures = 0
    for version in opts.versions.split(","):
        venv = prepare(version)
        doc = check(venv, found)
        rows = verdicts(found, doc)
        report["versions"][version] = {"reported": doc["version"], "results": doc["results"], "rows": rows}
        bad = [r for r in rows if not r[2]]
        failures += len(bad)
        print(f"vLLM {doc['version']}: {len(rows) - len(bad)}/{len(rows)} cases as expected")
        for form, verdict, ok, what in rows:
            print(f"  {'ok  ' if ok else 'FAIL'} {form:48} {verdict:18} {what}")
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
