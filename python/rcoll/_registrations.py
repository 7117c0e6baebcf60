"""Tells the core when memory it may keep registered with an RDMA device is freed.

The verbs transport caches memory registrations so that a training loop does not
re-register its buffers every step (csrc/rdma/mr_cache.h). A registration maps
the pages that were there when it was made; once the buffer is freed, the same
addresses can come back as other pages, and a stale registration would make the
NIC read or write the old ones. So for every buffer an op uses, a finalizer is
attached to the object that owns the memory (the root ndarray, or a torch
tensor's storage), and it drops the registrations of that memory when the owner
dies. Memory whose owner cannot be watched (bytes, bytearray, mmap) is dropped
from the cache as soon as the op completes instead.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Optional, Tuple

import numpy as np

Span = Tuple[int, int]  # (address, bytes)


def _owner_and_span(obj) -> Tuple[object, int, int]:
    """The object that owns `obj`'s memory, and the span to forget when it dies."""
    storage = getattr(obj, "untyped_storage", None)
    if storage is not None and not isinstance(obj, np.ndarray):  # a torch tensor
        s = storage()
        return s, s.data_ptr(), s.nbytes()
    arr = obj
    ptr, nbytes = arr.__array_interface__["data"][0], arr.nbytes
    root = arr
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, np.ndarray):  # owns its data: forget all of it
        return root, root.__array_interface__["data"][0], root.nbytes
    if getattr(root, "untyped_storage", None) is not None:  # a numpy view of a torch tensor
        s = root.untyped_storage()
        return s, s.data_ptr(), s.nbytes()
    return root, ptr, nbytes


class RegistrationTracker:
    def __init__(self, invalidate: Callable[[int, int], None]):
        self._invalidate = invalidate
        self._watched: dict = {}
        self._lock = threading.Lock()

    def track(self, obj) -> Optional[Span]:
        """Watches the owner of `obj`'s memory; returns the span to forget after the op
        when the owner cannot be watched."""
        owner, ptr, nbytes = _owner_and_span(obj)
        if nbytes == 0 or ptr == 0:
            return None
        key = (id(owner), ptr, nbytes)
        with self._lock:
            if key in self._watched:
                return None
            try:
                finalizer = weakref.finalize(owner, self._forget, key, ptr, nbytes)
            except TypeError:  # no weak references to bytes, bytearray, mmap, ...
                return (ptr, nbytes)
            finalizer.atexit = False
            self._watched[key] = finalizer
        return None

    def forget_later(self, spans) -> Callable[[], None]:
        """A callable that forgets `spans` (from track()) once the op no longer uses them."""
        def forget():
            for ptr, nbytes in spans:
                self._invalidate(ptr, nbytes)
        return forget

    def _forget(self, key, ptr: int, nbytes: int) -> None:
        with self._lock:
            self._watched.pop(key, None)
        self._invalidate(ptr, nbytes)
