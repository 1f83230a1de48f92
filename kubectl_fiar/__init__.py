"""``kubectl fiar``: a kubectl plugin that shows what fiar verified on each GPU node and what vLLM pods got.

Imports only ``fiar_contract`` and ``fiar_kube`` of the project (never the agent or the operator).
"""

__version__ = "0.1.0"
