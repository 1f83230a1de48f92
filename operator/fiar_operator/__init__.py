"""fiar operator: the FiAllreducePolicy custom resource and the pod / pods-binding admission webhooks."""

__version__ = "0.1.0"
