"""FlashInfer allreduce smoke tests, run in child processes.

The resident agent only uses ``launcher`` (and the pure ``outcome``, ``rules``, ``measure`` and
``events`` modules); it never imports ``worker``, which is the one module here that imports torch
and FlashInfer. Layout of one test::

    agent ── launcher.run_smoke ──(new session, hard timeout)──> supervisor
                                                                ├── rank 0: worker | simworker
                                                                ├── rank 1: ...
                                                                └── rank N-1
Each rank appends JSON events to its own file (``events``), so progress and the step where a rank
hung survive a SIGKILL of the whole group.
"""
