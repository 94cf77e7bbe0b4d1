"""Exceptions of the Horovod-compatible API, with Horovod's names and messages."""
from __future__ import annotations

__all__ = ["HorovodInternalError", "HorotopoInternalError", "HostsUpdatedInterrupt",
           "NOT_INITIALIZED", "SHUT_DOWN", "DUPLICATE_NAME"]

# Horovod's wording, so that scripts and tests that match on messages keep working.
NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of the ranks or "
             "an attempt to allreduce, allgather or broadcast a tensor after one of the ranks "
             "finished execution. If the shutdown was caused by an exception, you should see the "
             "exception in the log before the first shutdown message.")
DUPLICATE_NAME = ("Requested to allreduce, allgather, or broadcast a tensor with the same name as "
                  "another tensor that is currently being processed.  If you want to request "
                  "another tensor, use a different tensor name.")


class HorovodInternalError(RuntimeError):
    """A collective failed on every rank (a cross-rank mismatch, or the runtime shut down).

    The job stays usable after a mismatch: later collectives run normally.
    """


#: The same class under horotopo's own name.
HorotopoInternalError = HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod raises this in elastic mode when hosts change; horotopo has no elastic mode."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
