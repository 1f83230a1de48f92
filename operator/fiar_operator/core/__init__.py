"""The operator's rules: pure values and functions, no API calls, sockets or threads of their own.

Policies and selectors, the pod record, node facts, the decision, the engines' command lines, the
patch, the work budgets, settings, and the in-memory instruments (metrics, heartbeats). Imports no
other room of the operator.
"""
