"""`python -m rcoll bench`: the nccl-tests style size sweep of rcoll beside torch's
Gloo and Open MPI (cli.py says how it runs; docs/benchmarks.md shows results)."""
from .cli import main

__all__ = ["main"]
