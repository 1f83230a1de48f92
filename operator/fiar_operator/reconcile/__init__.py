"""The leader's work: the reconciler, policy status, unconfigured pods, events, leadership and the
webhook configuration it keeps following the policies. Imports ``core`` and ``state``, never
``admission``.
"""
