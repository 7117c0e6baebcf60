"""Horovod's elastic training, framework-independent part: the State a
training function commits and restores, and the loop of hvd.elastic.run.

When a rank fails, the others' next op raises HorovodInternalError; run()
then restores the last committed state, resets the job to the ranks that
are left (rcoll's shrink, basics.reset_after_failure), lets the state's
reset callbacks adapt (learning rate, ...), synchronizes the state from the
new rank 0 and calls the training function again.

When ranks wait to join (started with RCOLL_ELASTIC_JOIN=1), every rank's
next commit() raises HostsUpdatedInterrupt; run() resets the job to these
ranks followed by the newcomers (rcoll's grow, basics.reset_after_update),
keeps the state just committed and syncs it to everyone, the newcomers'
first sync included.
"""
from __future__ import annotations

import functools

from . import basics
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt


class State:
    """What a training function keeps across resets: save() / restore() /
    sync() are the framework's; commit() saves and looks for ranks waiting
    to join."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._last_ticket = 0  # of the ranks check_host_updates() saw waiting to join

    def register_reset_callbacks(self, callbacks):
        """Functions called after every reset (a rank removed), e.g. to scale the learning rate to the new size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (to host memory): a failure later goes back to here."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when ranks wait to join
        (as rank 0 sees the store; the others learn it by a broadcast, as in
        Horovod). A removed rank shows as a failure instead."""
        last_ticket = basics.ranks_waiting_to_join(self._bcast_object)
        if last_ticket:
            self._last_ticket = last_ticket
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Adapts objects to the new job after a reset, before sync()."""


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and kept as attributes."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def run_fn(func):
    """hvd.elastic.run's loop around `func(state, ...)` (module docstring)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
                basics.reset_after_failure()
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
                basics.reset_after_update(state._last_ticket)
            state.on_reset()

    return wrapper
