"""A real local Kubernetes control plane for fiar's tests, demo and benchmarks.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, built from pinned Go
modules (``tools/controlplane``) and started as loopback processes. This package is the one place
that owns it: pytest fixtures (``tests/conftest.py``), ``python -m devcluster up|down`` and the
benchmarks all go through :class:`devcluster.cluster.ControlPlane`.
"""

from devcluster.cluster import ControlPlane, Tier

__all__ = ["ControlPlane", "Tier"]
