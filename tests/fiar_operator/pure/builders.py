"""What several test files of the operator's pure tests share: the vLLM and SGLang command forms (as
their projects' own manifests write them), the policy and mutation those files apply to them, and
the group shapes of the decision table."""

from __future__ import annotations

import copy
import json
from typing import Any

from fiar_operator.admission.mutation import plan_pod_create
from fiar_operator.core import patches
from fiar_operator.core.decide import GroupPlan
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.core.selectors import node_constraint

USER_JSON = {"cudagraph_capture_sizes": [1, 2, 4], "pass_config": {"fuse_norm_quant": True}, "note": "ünï ${HOME} $x"}

FORMS: dict[str, dict[str, Any]] = {
    "production-stack": {
        "name": "vllm",
        "image": "lmcache/vllm-openai:latest",
        "command": ["/opt/venv/bin/vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000", "-O3"],
        "args": ["--tensor-parallel-size", "2"],
    },
    "kserve-vllmserver": {
        "name": "kserve-container",
        "image": "kserve/vllmserver:latest",
        "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
        "args": ["--port=8080", "--served-model-name=m", "--model=/mnt/models"],
    },
    "image-entrypoint": {
        "name": "vllm",
        "image": "docker.io/vllm/vllm-openai:v0.33.0",
        "args": ["--model", "m", "--tensor-parallel-size", "8"],
    },
    "llmisvc-additional-args": {
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
    "lws-shell-placeholder": {
        "name": "vllm-leader",
        "image": "vllm/vllm-openai:latest",
        "command": ["sh", "-c", "vllm serve m --tensor-parallel-size 8 $(FIAR_VLLM_ARGS) && sleep 1"],
    },
    "shell-quoted-placeholder": {
        "name": "vllm-leader",
        "image": "vllm/vllm-openai:latest",
        "command": ["bash", "-c", 'vllm serve m --tensor-parallel-size 8 "${FIAR_VLLM_ARGS}" && sleep 1'],
    },
    "user-json": {
        "name": "vllm",
        "image": "vllm/vllm-openai:latest",
        "command": ["vllm", "serve", "m", "--compilation-config", json.dumps(USER_JSON), "--port", "8000"],
    },
    "user-json-inline-in-args": {
        "name": "kserve-container",
        "image": "kserve/vllmserver:latest",
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": ["--model=/mnt/models", f"--compilation_config={json.dumps(USER_JSON)}"],
    },
    "user-dotted": {
        "name": "vllm",
        "image": "vllm/vllm-openai:latest",
        "command": [
            "vllm",
            "serve",
            "m",
            "-cc.cudagraph_mode=FULL",
            "--compilation-config.max_cudagraph_capture_size",
            "64",
        ],
    },
    "user-json-in-shell-placeholder": {
        "name": "vllm",
        "image": "vllm/vllm-openai:latest",
        "command": ["/bin/sh", "-c"],
        "args": [
            "exec vllm serve m --compilation-config "
            """'{"pass_config":{"fuse_allreduce_rms":$(FIAR_FUSE_ALLREDUCE_RMS)},"cudagraph_mode":"FULL"}'"""
        ],
    },
}

MODEL = "/models/qwen3-30b-a3b"
SGLANG_FORMS: dict[str, dict[str, Any]] = {
    # sgl-project/sglang docker/k8s-sglang-service.yaml
    "sglang-k8s-deployment": {
        "name": "sglang",
        "image": "docker.io/lmsysorg/sglang:latest",
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--model-path", MODEL, "--host", "0.0.0.0", "--port", "30000", "--tp", "2"],
    },
    # kubernetes-sigs/lws docs/examples/sglang/lws.yaml (leader and worker alike)
    "lws-sglang": {
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
    # sgl-project/ome config/runtimes/srt (an abbreviated --mem-frac, a $(MODEL_PATH) reference)
    "ome-runtime": {
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
            "debug",
        ],
        "env": [{"name": "MODEL_PATH", "value": MODEL}],
    },
    "sglang-serve": {
        "name": "sglang",
        "image": "lmsysorg/sglang:latest",
        "command": ["sglang", "serve", MODEL, "--tp", "2"],
    },
    "shell-placeholder": {
        "name": "sglang",
        "image": "lmsysorg/sglang:latest",
        "command": ["/bin/bash", "-c"],
        "args": [f'exec python3 -m sglang.launch_server "${{FIAR_SGLANG_ARGS}}" --model-path {MODEL} --tp 2'],
    },
}


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "vllm"}, "spec": {"podSelector": {}, **spec}})


def mutated(source: dict[str, Any], chosen: Policy | None = None) -> tuple[dict[str, Any], list[str]]:
    plan = plan_pod_create(source, chosen or policy(), {})
    out: dict[str, Any] = patches.apply(copy.deepcopy(source), plan.ops)
    assert out == plan.pod
    return out, plan.warnings


def shape_plan(shape: str) -> GroupPlan:
    if shape == "single":
        return GroupPlan()
    return GroupPlan(
        multi=True,
        key="g",
        pinned=shape.startswith("group-pinned"),
        constraint=node_constraint({}),
        imex=shape.endswith("-imex") and "no-imex" not in shape,
    )
