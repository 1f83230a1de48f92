"""fiar node agent: proves which FlashInfer allreduce backend works on this node and labels it."""

__version__ = "0.1.0"
