"""Credentials and the route to the API server: the in-cluster token is re-read when the kubelet
rotates it, a proxy is used unless NO_PROXY names the API server, and in-cluster never."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_kube as kube
from fiar_operator.core.errors import ConfigurationError
from fiar_operator.state import kube as operator_kube
from node_agent.errors import ConfigError
from node_agent.publish import load_client_config

from .conftest import Answer, Loopback, ServiceAccount


@pytest.mark.parametrize(
    ("url", "no_proxy", "bypass"),
    [
        ("https://10.96.0.1:443", "10.96.0.0/12", True),
        ("https://10.96.0.1:443", "10.0.0.0/16", False),
        ("https://10.96.0.1", "10.96.0.1", True),
        ("https://api.example.com:6443", "example.com", True),
        ("https://api.example.com:6443", ".example.com", True),
        ("https://api.example.com:6443", "xample.com", False),
        ("https://api.example.com:6443", "api.example.com:6443", True),
        ("https://api.example.com:6443", "api.example.com:443", False),
        ("https://API.Example.com", "api.example.com", True),
        ("https://[fd00::1]:6443", "fd00::/8", True),
        ("https://[fd00::1]:6443", "[fd00::1]:6443", True),
        ("https://kubernetes.default.svc", "*", True),
        ("https://kubernetes.default.svc", " , ,svc", True),
        ("https://kubernetes.default.svc", "", False),
        ("https://kubernetes.default.svc", None, False),
        ("https://10.96.0.1", "not/a/cidr,10.96.0.1.nip.io", False),
    ],
)
def test_no_proxy_names_hosts_suffixes_ports_and_ranges(url: str, no_proxy: str | None, bypass: bool) -> None:
    assert kube.bypasses_proxy(url, no_proxy) is bypass


def test_lowercase_proxy_variables_win_as_in_urllib() -> None:
    found = kube.proxies({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:1", "NO_PROXY": "a"})
    assert found == {"https": "http://lower:1", "no": "a"}


def served(body: Any = None) -> Callable[[Any], Answer]:
    return lambda seen: Answer(200, body if body is not None else {"kind": "NodeList", "items": []})


def test_requests_go_through_the_proxy_unless_no_proxy_names_the_server(serve: Callable[..., Loopback]) -> None:
    api_server, proxy = serve(served()), serve(served({"from": "proxy"}))
    cfg = client.Configuration(host=api_server.url)
    via_proxy = kube.Client(cfg, user_agent="t", environ={"http_proxy": proxy.url})
    assert via_proxy.request("GET", "/api/v1/nodes") == {"from": "proxy"}
    assert proxy.seen[0].path == f"{api_server.url}/api/v1/nodes" and not api_server.seen

    direct = kube.Client(cfg, user_agent="t", environ={"http_proxy": proxy.url, "NO_PROXY": "localhost,127.0.0.0/8"})
    direct.request("GET", "/api/v1/nodes")
    assert len(proxy.seen) == 1 and api_server.seen[0].path == "/api/v1/nodes"


def test_a_kubeconfig_proxy_url_is_used_whatever_no_proxy_says(serve: Callable[..., Loopback]) -> None:
    api_server, proxy = serve(served()), serve(served({"from": "proxy"}))
    cfg = client.Configuration(host=api_server.url)
    cfg.proxy = proxy.url  # what load_kube_config sets from a cluster's proxy-url
    api = kube.Client(cfg, user_agent="t", environ={"NO_PROXY": "localhost,127.0.0.0/8"})
    assert api.request("GET", "/api/v1/nodes") == {"from": "proxy"}
    assert not api_server.seen


def in_cluster(account: ServiceAccount, server: Loopback) -> Any:
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    return kube.load_config(None, environ=environ, service_account=str(account.folder))


def test_a_rotated_service_account_token_is_used_on_the_next_request(
    serve: Callable[..., Loopback], service_account: ServiceAccount
) -> None:
    server = serve(served(), tls=service_account.serving)
    api = kube.Client(in_cluster(service_account, server), user_agent="t", environ={})
    api.request("GET", "/api/v1/nodes")
    service_account.token.write_text("second-token")  # the kubelet replaces the projected token
    api.request("GET", "/api/v1/nodes")
    service_account.token.write_text("")  # caught half-written: the last token is kept
    api.request("GET", "/api/v1/nodes")
    tokens = [seen.headers["Authorization"] for seen in server.seen]
    assert tokens == ["Bearer first-token", "Bearer second-token", "Bearer second-token"]


def test_in_cluster_the_api_server_is_never_reached_through_a_proxy(
    serve: Callable[..., Loopback], service_account: ServiceAccount
) -> None:
    server, proxy = serve(served(), tls=service_account.serving), serve(served({"from": "proxy"}))
    cfg = in_cluster(service_account, server)
    api = kube.Client(cfg, user_agent="t", environ={"https_proxy": proxy.url, "HTTPS_PROXY": proxy.url})
    assert api.request("GET", "/api/v1/nodes") == {"kind": "NodeList", "items": []}
    assert not proxy.seen and len(server.seen) == 1


def test_a_missing_kubeconfig_is_each_components_configuration_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "nonexistent")
    with pytest.raises(kube.ConfigError, match=f"cannot load kubeconfig {missing}"):
        kube.load_config(missing)
    with pytest.raises(ConfigError, match="cannot load kubeconfig"):
        load_client_config(missing)
    with pytest.raises(ConfigurationError, match="no usable Kubernetes credentials"):
        operator_kube.configuration(missing)


def test_outside_a_cluster_only_the_operator_falls_back_to_the_default_kubeconfig(tmp_path: Path) -> None:
    empty = tmp_path / "no-serviceaccount"
    empty.mkdir()
    with pytest.raises(kube.ConfigError, match="in-cluster service account"):
        kube.load_config(None, environ={}, service_account=str(empty))
    with pytest.raises(kube.ConfigError, match=r"or ~/\.kube/config"):
        kube.load_config(
            None, default_kubeconfig=True, environ={"KUBECONFIG": str(tmp_path / "none")}, service_account=str(empty)
        )
