"""What the operator knows of the cluster: the API client, the watched kinds, their informers, the
in-memory indexes (``Store``) and the queue of changes. Imports only ``core``.
"""
