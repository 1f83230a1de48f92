"""fiar's SGLang option checked against SGLang's own parser and post-process passes.

For each SGLang command form (SGLang's Kubernetes Deployment, LeaderWorkerSet's ``docs/examples/sglang``,
an OME ClusterServingRuntime, ``sglang serve MODEL``, a ``bash -c`` string with fiar's placeholder),
each node verdict (or group shape), each model (one SGLang enables the fusion for, one it does not)
and each GPU generation, this script

1. lets fiar's pod webhook mutate the container (``plan_pod_create``) and its binding decision
   annotate the pod (``decide`` + ``Decision.annotations``), exactly as the operator does;
2. resolves env and ``$(VAR)`` as the kubelet does (``devcluster.kubelet.container_process``), then runs shell
   forms through a real bash with a stand-in ``python3`` that records its argv;
3. feeds those arguments, in a throwaway venv per SGLang version, to SGLang's own
   ``prepare_server_args`` (``sglang serve``: after its positional model path is normalized, as
   ``sglang/cli/serve.py`` does) and ``ServerArgs.resolve_once`` (the post-process passes, the fusion's
   auto-enable and enforce-disable among them), with a local model folder whose ``config.json`` names
   the architecture (nothing is downloaded) and SGLang's own ``override_platform`` saying SM90 or
   SM100 (no GPU here; ``--device cuda`` is appended for the same reason), and checks the resolved
   ``flashinfer_allreduce_fusion_backend`` and ``enforce_disable_flashinfer_allreduce_fusion``: fiar's
   ``off`` gives no backend, fiar's ``engine`` gives what the same command without fiar's option gives
   (a control run per case), and the user's other options survive.

Controls show what fiar avoids: a backend set on the command line turns the fusion on for a model
SGLang leaves it off for, and an annotation that went missing (``--`` alone) is refused by SGLang.

The venvs live outside the repository (``~/.cache/fiar/sglang-check``, override with
``FIAR_SGLANG_CHECK_DIR``; the wheels in ``~/.cache/fiar/wheels``, shared with ``bench/engine_release.py``):
each has only its SGLang wheel (``--no-deps``) plus ``ipython`` and ``gguf``
(imported while parsing) and reads torch, transformers and the rest from the base venv of
``bench/vllm_parser_check.py`` through a ``.pth`` file (made there when missing). Needs PyPI.

    .venv/bin/python bench/sglang_check.py [--versions 0.5.20,0.5.23] [--out FILE]
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

import vllm_parser_check

import fiar_contract as contract
from devcluster.kubelet import container_process
from fiar_operator.admission.mutation import plan_pod_create
from fiar_operator.core import decide, patches
from fiar_operator.core.decide import GroupPlan
from fiar_operator.core.nodefacts import MULTI_NODE_BACKEND, node_facts
from fiar_operator.core.policy import parse_policy
from fiar_operator.core.selectors import node_constraint

VERSIONS = ("0.5.20", "0.5.23")
CACHE = Path(os.environ.get("FIAR_SGLANG_CHECK_DIR", Path.home() / ".cache" / "fiar" / "sglang-check"))
PARSE_DEPS = ("ipython", "gguf")
MODEL = "{model}"
CLIQUE = "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.32766"
B, M, MN, T, C, CC = (
    contract.LABEL_BACKEND,
    contract.LABEL_MULTICAST,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_CLIQUE,
    contract.LABEL_COMPUTE_CAPABILITY,
)

NODES: dict[str, tuple[dict[str, str], GroupPlan]] = {
    # verdict -> (the agent's labels, the pod's group)
    "mnnvl+trtllm": ({B: "mnnvl", M: "supported", MN: "pass", T: "pass"}, GroupPlan()),
    "trtllm, no multicast": ({B: "trtllm", M: "unsupported", MN: "skipped", T: "pass"}, GroupPlan()),
    "trtllm, multicast disabled": ({B: "trtllm", M: "disabled", MN: "skipped", T: "pass"}, GroupPlan()),
    "mnnvl, trtllm failed": ({B: "mnnvl", M: "supported", MN: "pass", T: "fail"}, GroupPlan()),
    "none": ({B: "none", M: "unsupported", MN: "fail", T: "fail"}, GroupPlan()),
}
GROUPS: dict[str, tuple[dict[str, str], GroupPlan]] = {
    "group: mnnvl, one clique, IMEX": (
        {B: "mnnvl", M: "supported", MN: "pass", T: "pass", C: CLIQUE},
        GroupPlan(multi=True, key="g", pinned=True, constraint=node_constraint({}), imex=True),
    ),
    "group: no IMEX channel": (
        {B: "mnnvl", M: "supported", MN: "pass", T: "pass", C: CLIQUE},
        GroupPlan(multi=True, key="g", pinned=True, constraint=node_constraint({}), imex=False),
    ),
}
MODELS = {
    # architecture -> config.json model_type; the first is on SGLang's fusion list, the second is not
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlamaForCausalLM": "llama",
}
PLATFORMS = {"sm90": "9.0", "sm100": "10.0"}
"""SGLang's platform -> the ``fiar.io/compute-capability`` the agent writes for such GPUs."""

FORMS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (entry, container, user settings that must survive: ServerArgs field -> value)
    "sglang-k8s-deployment": (
        "launch_server",
        {
            "name": "sglang",
            "image": "docker.io/lmsysorg/sglang:latest",
            "command": ["python3", "-m", "sglang.launch_server"],
            "args": ["--model-path", MODEL, "--host", "0.0.0.0", "--port", "30000", "--tp", "2"],
        },
        {"host": "0.0.0.0", "port": 30000, "tp_size": 2, "log_level": "info"},
    ),
    "ome-runtime": (
        "launch_server",
        {
            "name": "ome-container",
            "image": "docker.io/lmsysorg/sglang:v0.5.5.post3-cu129-amd64",
            "command": [
                "python3",
                "-m",
                "sglang.launch_server",
                "--host",
                "0.0.0.0",
                "--port",
                "8080",
                "--enable-metrics",
                "--model-path",
                "$(MODEL_PATH)",
                "--tp-size",
                "2",
                "--mem-frac",
                "0.9",
                "--log-level",
                "warning",
            ],
            "env": [{"name": "MODEL_PATH", "value": MODEL}],
        },
        {"port": 8080, "enable_metrics": True, "tp_size": 2, "mem_fraction_static": 0.9, "log_level": "warning"},
    ),
    "sglang-serve": (
        "serve",
        {"name": "sglang", "image": "lmsysorg/sglang:latest", "command": ["sglang", "serve", MODEL, "--tp", "2"]},
        {"tp_size": 2},
    ),
    "shell-placeholder": (
        "launch_server",
        {
            "name": "sglang",
            "image": "lmsysorg/sglang:latest",
            "command": ["/bin/bash", "-c"],
            "args": [
                f'exec python3 -m sglang.launch_server "${{FIAR_SGLANG_ARGS}}" --model-path {MODEL} --tp 2 '
                "--log-level debug"
            ],
        },
        {"tp_size": 2, "log_level": "debug"},
    ),
    "lws-sglang": (
        "launch_server",
        {
            "name": "sglang-leader",
            "image": "lmsysorg/sglang:latest",
            "command": [
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                MODEL,
                "--tp",
                "2",
                "--dist-init-addr",
                "$(LWS_LEADER_ADDRESS):20000",
                "--nnodes",
                "$(LWS_GROUP_SIZE)",
                "--node-rank",
                "$(LWS_WORKER_INDEX)",
                "--trust-remote-code",
                "--host",
                "0.0.0.0",
                "--port",
                "40000",
            ],
            "env": [
                {"name": "LWS_LEADER_ADDRESS", "value": "sglang-0.sglang.ml"},
                {"name": "LWS_GROUP_SIZE", "value": "2"},
                {"name": "LWS_WORKER_INDEX", "value": "0"},
            ],
        },
        {"nnodes": 2, "node_rank": 0, "dist_init_addr": "sglang-0.sglang.ml:20000", "trust_remote_code": True},
    ),
}
GROUP_FORMS = frozenset({"lws-sglang"})


def sglang_tokens(entry: str, container: dict[str, Any], argv: list[str], env: dict[str, str]) -> list[str]:
    """The arguments SGLang's server parses, as the process gets them."""
    if os.path.basename(argv[0]) in ("sh", "bash"):
        recorded = vllm_parser_check._shell_argv(argv, env, program="python3")
        return recorded[2:]  # drop "-m sglang.launch_server"
    return argv[2:] if entry == "serve" else argv[3:]


def _fill(value: Any, model: str) -> Any:
    if isinstance(value, str):
        return value.replace(MODEL, model)
    if isinstance(value, list):
        return [_fill(v, model) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, model) for k, v in value.items()}
    return value


def _verified(labels: dict[str, str], decision: decide.Decision) -> frozenset[str]:
    """The backends the pod's node (a group: its one multi-node backend) verifies where its fusion is on."""
    if not decision.verified:
        return frozenset()
    return frozenset({MULTI_NODE_BACKEND}) if decision.group else node_facts("gpu-1", labels).verified


def cases(models: dict[str, str]) -> list[dict[str, Any]]:
    """``models``: architecture -> local model folder."""
    policy = parse_policy({"metadata": {"name": "sglang"}, "spec": {"podSelector": {}}})
    found: list[dict[str, Any]] = []
    for form, (entry, template, user) in FORMS.items():
        nodes = GROUPS if form in GROUP_FORMS else NODES
        for arch, folder in models.items():
            container = _fill(template, folder)
            source = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [copy.deepcopy(container)]}}
            plan = plan_pod_create(source, policy, {})
            pod = patches.apply(copy.deepcopy(source), plan.ops)
            plain = {"metadata": {"name": "p", "namespace": "ml", "annotations": {}}, "spec": source["spec"]}
            control_argv, control_env = container_process(plain, container)
            if form == "shell-placeholder":  # without fiar the placeholder is not there: the user's own command
                control_env = {**control_env, contract.ENV_SGLANG_ARGS: "--log-level=info"}
            control = sglang_tokens(entry, container, control_argv, control_env)
            control = [t for t in control if t != "--log-level=info"]
            for verdict, (labels, group) in nodes.items():
                for platform, cc in PLATFORMS.items():
                    labelled = {**labels, CC: cc}
                    decision = decide.decide(policy, "gpu-1", labelled, group, {"gpu-1": labelled})
                    bound = copy.deepcopy(pod)
                    bound["metadata"]["annotations"].update(decision.annotations())
                    mutated = bound["spec"]["containers"][0]
                    argv, env = container_process(bound, mutated)
                    found.append(
                        {
                            "form": form,
                            "verdict": verdict,
                            "model": arch,
                            "platform": platform,
                            "entry": entry,
                            "flag": decision.sglang_flag,
                            "tokens": sglang_tokens(entry, mutated, argv, env),
                            "control": control,
                            "user": user,
                            "multi": group.multi,
                            "verified": sorted(_verified(labelled, decision)),
                        }
                    )
    llama = models["LlamaForCausalLM"]
    found.append(
        {
            "form": "control: a backend set on a model SGLang leaves off",
            "verdict": "-",
            "model": "LlamaForCausalLM",
            "platform": "sm90",
            "entry": "launch_server",
            "tokens": ["--model-path", llama, "--tp", "2", "--flashinfer-allreduce-fusion-backend=trtllm"],
            "expect_backend": "trtllm",
            "user": {},
        }
    )
    found.append(
        {
            "form": "control: the annotation went missing ('--')",
            "verdict": "-",
            "model": "LlamaForCausalLM",
            "platform": "sm90",
            "entry": "launch_server",
            "tokens": ["--", "--model-path", llama, "--tp", "2"],
            "expect_error": "SystemExit",
            "user": {},
        }
    )
    return found


CHECKER = r"""
import json, logging, os, sys, warnings
warnings.filterwarnings("ignore")
cases = json.load(sys.stdin)
import sglang
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import override_platform
import sglang.srt.runtime_context as runtime_context
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.cli.serve import _normalize_positional_model_path
FACTS = {
    "sm90": {"is_sm90": True, "is_sm100": False, "is_blackwell": False, "is_hopper": True},
    "sm100": {"is_sm90": False, "is_sm100": True, "is_blackwell": True, "is_hopper": False},
}
known = set(runtime_context._PLATFORM_PROBES)

def plain(value):
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)

def resolve(tokens, entry, platform):
    argv = list(tokens)
    if entry == "serve":
        argv, _ = _normalize_positional_model_path(argv)
    facts = {k: v for k, v in FACTS[platform].items() if k in known}
    with override_platform(**facts):
        args = prepare_server_args(argv + ["--device", "cuda"])
        args.resolve_once()
        return resolving_view(args)

def runs(backend, platform, multi):
    # what SGLang's own _resolve_backend makes of the backend at start-up on the platform
    if backend is None:
        return None
    from sglang.srt.layers.flashinfer_comm_fusion import _resolve_backend
    facts = {k: v for k, v in FACTS[platform].items() if k in known}
    with override_platform(**facts):
        try:
            return _resolve_backend(backend, is_multi_node=multi)
        except ValueError as exc:
            return "raises: " + str(exc)[:120]

results = []
for case in cases:
    result = {}
    try:
        view = resolve(case["tokens"], case["entry"], case["platform"])
        result.update(
            backend=view.flashinfer_allreduce_fusion_backend,
            enforce=bool(view.enforce_disable_flashinfer_allreduce_fusion),
            user={k: plain(getattr(view, k)) for k in case["user"]},
        )
        if "control" in case:
            own = resolve(case["control"], case["entry"], case["platform"])
            result["own"] = own.flashinfer_allreduce_fusion_backend
            result["runs"] = runs(result["backend"], case["platform"], case["multi"])
    except BaseException as exc:
        result["error"] = type(exc).__name__
        result["message"] = str(exc)[:300]
    results.append(result)
print(json.dumps({"version": sglang.__version__, "results": results}))
"""


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, text=True)


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def prepare(version: str) -> Path:
    """A venv with SGLang ``version`` (no deps) over vllm_parser_check's base venv; made once."""
    base = vllm_parser_check.CACHE / "base"
    if not (base / ".ready").exists():
        vllm_parser_check.prepare(vllm_parser_check.BASE_VERSION)
    venv = CACHE / f"sglang-{version}"
    if not (venv / ".ready").exists():
        _run([sys.executable, "-m", "venv", str(venv)])
        wheels = vllm_parser_check.WHEELS  # shared with bench/engine_release.py
        wheel = next(wheels.glob(f"sglang-{version}-*.whl"), None)
        if wheel is None:
            _run([str(venv / "bin" / "pip"), "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(wheels)])
            wheel = next(wheels.glob(f"sglang-{version}-*.whl"))
        _run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)])
        (_site_packages(venv) / "fiar-base.pth").write_text(str(_site_packages(base)) + "\n")
        _run([str(venv / "bin" / "pip"), "install", "-q", *PARSE_DEPS])
        (venv / ".ready").write_text(version)
    return venv


def model_folders(root: Path) -> dict[str, str]:
    """A local model folder per architecture: a config.json and nothing else."""
    folders = {}
    for arch, model_type in MODELS.items():
        folder = root / arch
        folder.mkdir()
        config = {
            "architectures": [arch],
            "model_type": model_type,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
            "vocab_size": 1000,
            "max_position_embeddings": 2048,
            "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-5,
        }
        (folder / "config.json").write_text(json.dumps(config))
        folders[arch] = str(folder)
    return folders


def check(venv: Path, found: list[dict[str, Any]]) -> dict[str, Any]:
    return vllm_parser_check.run_in_venv(venv, ["-c", CHECKER], found, ("SGLANG_", "VLLM_"), 1800, HF_HUB_OFFLINE="1")


def verdicts(found: list[dict[str, Any]], doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case: what SGLang resolved, and whether it is what fiar's option should give."""
    rows = []
    for case, result in zip(found, doc["results"], strict=True):
        row = {k: case[k] for k in ("form", "verdict", "model", "platform")}
        row["flag"] = case.get("flag", "-")
        if "expect_error" in case:
            row.update(ok=result.get("error") == case["expect_error"], what=result.get("error") or "accepted")
        elif "error" in result:
            row.update(ok=False, what=f"{result['error']}: {result['message']}")
        elif "expect_backend" in case:
            row.update(ok=result["backend"] == case["expect_backend"], what=f"backend={result['backend']}")
        else:
            kept = all(result["user"].get(k) == v for k, v in case["user"].items())
            if case["flag"] == "off":
                fused = result["backend"] is None and result["enforce"]
            else:
                fused = result["backend"] == result["own"] and not result["enforce"]
            # what runs at start-up (cutedsl on mnnvl's multicast fabric memory) is verified on the node
            runs = "mnnvl" if result["runs"] == "cutedsl" else result["runs"]
            verified = runs is None or runs in case["verified"]
            row.update(
                ok=fused and kept and verified,
                backend=result["backend"],
                own=result["own"],
                runs=result["runs"],
                what=f"backend={result['backend']} (own: {result['own']}) enforce_disable={result['enforce']}"
                + (f" runs {result['runs']}" if result["runs"] else "")
                + ("" if verified else f", not verified (node verifies {case['verified']})")
                + ("" if kept else f" user settings {result['user']} != {case['user']}"),
            )
        rows.append(row)
    return rows


def _flag_text(flag: str) -> str:
    return f"--{contract.SGLANG_FLAGS[flag]}" if flag in contract.SGLANG_FLAGS else flag  # type: ignore[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    opts = parser.parse_args()
    report: dict[str, Any] = {"versions": {}}
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        found = cases(model_folders(Path(tmp)))
        for version in opts.versions.split(","):
            doc = check(prepare(version), found)
            rows = verdicts(found, doc)
            report["versions"][version] = {"reported": doc["version"], "rows": rows}
            bad = [r for r in rows if not r["ok"]]
            failures += len(bad)
            print(f"SGLang {doc['version']}: {len(rows) - len(bad)}/{len(rows)} cases as expected")
            for r in rows:
                print(
                    f"  {'ok  ' if r['ok'] else 'FAIL'} {r['form']:24.24} {r['verdict']:28} {r['model']:20} "
                    f"{r['platform']:6} {_flag_text(r['flag']):46.46} {r['what']}"
                )
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
