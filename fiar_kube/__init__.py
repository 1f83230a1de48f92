"""The one seam to the Kubernetes API, shared by the operator and the node agent (neither imports the other).

Both components talk raw JSON: requests on kept connections of this package's own (``Lane``: a
request costs less than half what it costs through urllib3), watch streams over a urllib3 pool.
Objects stay plain dicts. Nothing is imported at module level but the standard library: urllib3 and
PyYAML are loaded when a component first talks to the API.

A module per job, each rule stated once (the import-direction test, tests/harness/test_layout_guards.py,
keeps them one way: nothing here imports the operator, the agent or the kubectl plugin):

* ``errors``: the typed errors; ``error_for`` maps an HTTP status (or a watch ERROR event's Status) to
  a type, once; callers decide by type, never by number;
* ``backoff``: ``Backoff`` / ``backoff_delay``;
* ``credentials``: ``Credentials``, the in-cluster service account, ``authorization`` (the refresh hook
  of the configuration runs first) and ``impersonation``;
* ``kubeconfig``: a kubeconfig read as client-go reads it, and ``load_config`` (kubeconfig, else
  in-cluster, else optionally the default kubeconfig);
* ``pem``: inline PEM data loaded into a TLS context from memory;
* ``proxy``: the proxy of the kubeconfig or the environment, unless ``NO_PROXY`` names the host;
* ``tls``: the TLS settings of a configuration, for both transports;
* ``deadline``: a request's time limits; ``http1``: HTTP/1.1 answers read from a socket;
* ``lane``: ``Lane``, requests on kept connections (only where no proxy is used);
* ``pool``: ``pool_manager``, the urllib3 pool watch streams use;
* ``watch``: ``WatchLines`` splits a watch stream into JSON events, each line bounded;
* ``client``: ``Client``, JSON requests and watch streams.

The transport is synchronous: both components call the API from threads (the operator's webhooks
hand their few reads to a thread pool), so there is one transport, not a sync and an async one.
"""

from __future__ import annotations

from .backoff import Backoff, backoff_delay
from .client import (
    APPLY_PATCH,
    ERROR_READ,
    JSON,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    Client,
    segment,
    target,
    url,
)
from .credentials import SERVICE_ACCOUNT, Credentials, TokenFile, authorization, impersonation, in_cluster
from .deadline import Timeout
from .errors import (
    MAX_ERROR_BODY,
    ApiError,
    ConfigError,
    Conflict,
    EventTooLarge,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    Rejected,
    Unauthorized,
    Unavailable,
    Unsendable,
    error_for,
    error_type,
    status_error,
    status_message,
)
from .http1 import MAX_HEAD_BYTES
from .kubeconfig import KUBECONFIG_EVENTS, KUBECONFIG_MAX, from_kubeconfig, load_config
from .lane import KEPT_IDLE_S, Lane
from .pool import pool_manager
from .proxy import bypasses_proxy, proxies, proxy_for
from .tls import tls_context
from .watch import MAX_EVENT_BYTES, WatchLines

__all__ = [
    "APPLY_PATCH",
    "ERROR_READ",
    "JSON",
    "KEPT_IDLE_S",
    "KUBECONFIG_EVENTS",
    "KUBECONFIG_MAX",
    "MAX_ERROR_BODY",
    "MAX_EVENT_BYTES",
    "MAX_HEAD_BYTES",
    "MERGE_PATCH",
    "SERVICE_ACCOUNT",
    "STRATEGIC_MERGE_PATCH",
    "ApiError",
    "Backoff",
    "Client",
    "ConfigError",
    "Conflict",
    "Credentials",
    "EventTooLarge",
    "Forbidden",
    "Gone",
    "Invalid",
    "Lane",
    "NotFound",
    "Rejected",
    "Timeout",
    "TokenFile",
    "Unauthorized",
    "Unavailable",
    "Unsendable",
    "WatchLines",
    "authorization",
    "backoff_delay",
    "bypasses_proxy",
    "error_for",
    "error_type",
    "from_kubeconfig",
    "impersonation",
    "in_cluster",
    "load_config",
    "pool_manager",
    "proxies",
    "proxy_for",
    "segment",
    "status_error",
    "status_message",
    "target",
    "tls_context",
    "url",
]
