"""Horovod's error types, raised where Horovod raises them."""


class HorovodInternalError(RuntimeError):
    """A collective failed (a peer died, ranks disagreed, a timeout): the job's
    communicators are unusable until a reset. hvd.elastic.run catches it and
    restores the last committed state. The message names the rank and the op;
    the rcoll error is its __cause__."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of ranks changed (a rank joined an elastic job): hvd.elastic.run
    resets without restoring, keeping the state as it is when `skip_sync`."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the job's ranks changed")
        self.skip_sync = skip_sync
