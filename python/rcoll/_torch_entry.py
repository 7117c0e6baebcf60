"""The `torch.backends` entry point: torch calls register_backend() while it is
being imported, so that init_process_group(backend="rcoll") needs no import of
rcoll. It must be cheap (the backend module loads on first use) and must never
raise: an exception here would break `import torch` for everyone.
"""


def register_backend() -> None:
    try:
        import torch.distributed as dist

        if not dist.is_available() or getattr(dist.Backend, "RCOLL", None) == "rcoll":
            return
        dist.Backend.register_backend("rcoll", _create_process_group, devices=["cpu", "cuda"])
    except Exception as exc:  # never break `import torch`
        import warnings

        warnings.warn(f"rcoll: could not register the torch.distributed backend: {exc}", RuntimeWarning,
                      stacklevel=2)


def _create_process_group(store, rank, size, timeout):
    from rcoll.torch_backend import _create_process_group as create

    return create(store, rank, size, timeout)
