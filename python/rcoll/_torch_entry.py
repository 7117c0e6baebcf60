"""How torch learns of the backend "rcoll".

- The `torch.backends` entry point: torch 2.5 and later call
  register_backend() while `import torch` runs, so that
  init_process_group(backend="rcoll") needs no import of rcoll.
- `import rcoll`, for releases that do not load that entry point (2.4): it
  registers the backend at once if torch.distributed is imported, else as soon
  as it is (register_when_torch_loads), so the import may come before or after
  torch's.

Both must be cheap (the backend module loads on first use) and must never
raise: an exception here would break `import torch` or `import rcoll` for
everyone.
"""
import sys


def register_backend() -> None:
    try:
        import torch.distributed as dist

        if not dist.is_available() or getattr(dist.Backend, "RCOLL", None) == "rcoll":
            return
        dist.Backend.register_backend("rcoll", _create_process_group, extended_api=True, devices=["cpu", "cuda"])
    except Exception as exc:  # never break `import torch`
        import warnings

        warnings.warn(f"rcoll: could not register the torch.distributed backend: {exc}", RuntimeWarning,
                      stacklevel=2)


def _create_process_group(options, backend_options=None):
    from rcoll.torch_backend import _create_process_group as create

    return create(options, backend_options)


class _AfterTorchDistributed:
    """A meta path finder that only watches for torch.distributed: it lets the
    usual finder find it, and registers the backend once its module has run."""

    def __init__(self):
        self.seen = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch.distributed" or self.seen:
            return None
        self.seen = True
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(name, path, target) if finder is not self and find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_register(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register_backend()

        spec.loader.exec_module = exec_then_register
        return spec


def register_when_torch_loads() -> None:
    if "torch.distributed" in sys.modules:
        if hasattr(sys.modules["torch.distributed"], "Backend"):  # not while it is still being imported
            register_backend()
    elif not any(isinstance(f, _AfterTorchDistributed) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchDistributed())
