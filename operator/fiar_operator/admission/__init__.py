"""The webhooks, on every replica: the transport (connections, body budget, TLS), the server (routes,
the review pipeline, health), the review and the pod's mutation. Imports ``core`` and ``state``,
never ``reconcile``.
"""
