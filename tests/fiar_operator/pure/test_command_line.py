"""``fiar-operator``: the printed webhook configuration, and clear errors for unusable settings."""

from __future__ import annotations

import base64
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

EXE = str(Path(sys.executable).parent / "fiar-operator")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60)


def test_webhook_config_fails_open_with_a_short_binding_timeout(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    out = run(
        "webhook-config",
        "--service",
        "fiar-system/fiar-operator:443",
        "--ca-file",
        str(ca),
        "--exclude-namespace",
        "kube-system",
        "--exclude-namespace",
        "fiar-system",
    )
    assert out.returncode == 0, out.stderr
    config, policies = yaml.safe_load_all(out.stdout)
    assert config["kind"] == "MutatingWebhookConfiguration"
    hooks = {h["name"]: h for h in config["webhooks"]}
    assert set(hooks) == {"pods.fiar.io", "binding.fiar.io"}
    for hook in hooks.values():
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca.read_bytes()
        assert hook["clientConfig"]["service"]["namespace"] == "fiar-system"
        exprs = hook["namespaceSelector"]["matchExpressions"]
        assert {"key": "fiar.io/ignore", "operator": "DoesNotExist"} in exprs
        assert {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "fiar-system"],
        } in exprs
    assert hooks["binding.fiar.io"]["rules"][0]["resources"] == ["pods/binding"]
    assert policies["kind"] == "ValidatingWebhookConfiguration"
    (policy_hook,) = policies["webhooks"]
    assert policy_hook["name"] == "policies.fiar.io"
    assert policy_hook["failurePolicy"] == "Ignore" and policy_hook["sideEffects"] == "NoneOnDryRun"
    assert policy_hook["rules"][0]["resources"] == ["fiallreducepolicies"]
    assert policy_hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert policy_hook["clientConfig"]["service"]["path"] == "/validate/policies"
    assert hooks["binding.fiar.io"]["timeoutSeconds"] <= 2
    assert hooks["pods.fiar.io"]["reinvocationPolicy"] == "IfNeeded"
    assert hooks["pods.fiar.io"]["clientConfig"]["service"]["path"] == "/mutate/pods"


def test_malformed_service_reference_is_explained(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    out = run("webhook-config", "--service", "no-port", "--ca-file", str(ca))
    assert out.returncode == 2 and "NAMESPACE/NAME:PORT" in out.stderr


def test_missing_certificate_files_stop_the_operator_before_it_starts(tmp_path: Path) -> None:
    out = run("run", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"))
    assert out.returncode == 2 and "does not exist" in out.stderr
    out = run("run", "--tls-cert", str(tmp_path / "tls.crt"))
    assert out.returncode == 2 and "go together" in out.stderr


def test_missing_credentials_are_reported_not_raised(tmp_path: Path) -> None:
    out = run("run", "--kubeconfig", str(tmp_path / "absent.yaml"), "--metrics-port", "-1")
    assert out.returncode == 2 and "no usable Kubernetes credentials" in out.stderr
    assert "Traceback" not in out.stderr


def test_busy_webhook_port_is_reported(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run(
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--standalone",
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(port),
            "--metrics-port",
            "-1",
        )
    assert out.returncode == 2 and "did not start" in out.stderr


def test_the_peering_identity_is_the_pod_name_else_host_and_pid() -> None:
    """kopf's default identity asks getpass for a user name, which raises for the image's uid 65532
    (no passwd entry): every operator pod crashed at start on the real node of tier D."""
    from fiar_operator.cli import peer_identity

    assert peer_identity({"POD_NAME": "fiar-operator-5d9-abcde"}, "node-1", 7) == "fiar-operator-5d9-abcde"
    assert peer_identity({}, "node-1", 7) == "node-1/7"


def test_run_takes_its_defaults_from_the_settings_dataclass(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from fiar_operator.cli import _settings, build_parser
    from fiar_operator.core.settings import Settings

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    settings = _settings(build_parser().parse_args(["run"]))
    assert dataclasses.replace(settings, priority=0) == Settings()
