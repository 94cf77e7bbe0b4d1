"""Never hang, never die quietly: abort on unhandled exceptions, a watchdog for dead peers, and
liveness pings. One job per module, usable separately:

- :mod:`~horotopo.reliability.abort`: :func:`install_excepthook` (an unhandled exception on
  any rank prints its traceback under a line naming the rank, then ``MPI_Abort`` ends the
  whole job) and :func:`abort`, the one way out.
- :mod:`~horotopo.reliability.tracking`: :class:`TrackedTransport`, the transport decorator
  that remembers whom this rank waits for (and raises :class:`PeerFailure` naming dead peers)
  and measures the rate of each link from the engine's own sends.
- :mod:`~horotopo.reliability.watchdog`: :class:`Watchdog`, a thread that aborts the job when a
  guarded operation outlives ``HOROTOPO_TIMEOUT_S`` (:func:`timeout_from_env`), naming the
  ranks it was waiting for.
- :mod:`~horotopo.reliability.liveness`: :class:`LivenessResponder`, pings over the transport
  that find the dead or stopped ranks when a wait names none.
- :mod:`~horotopo.reliability.targets`: :func:`~horotopo.reliability.targets.summarize`, the
  robustness verdict over repeated jobs' timings (fraction of the optimum, time against
  ``MPI_Allreduce``, wrong elements).

Only :mod:`horotopo.transport.mpi` touches MPI; this package reaches it through the
transport. :class:`~horotopo.config.ConfigError` is re-exported for the callers that catch it
here.
"""
from ..config import ConfigError
from .abort import (ABORT_EXIT_CODE, abort, abort_excepthook, install_excepthook,
                    uninstall_excepthook)
from .liveness import LivenessResponder
from .tracking import PeerFailure, TrackedTransport
from .watchdog import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, Watchdog, timeout_from_env

__all__ = ["ConfigError", "timeout_from_env",
           "install_excepthook", "uninstall_excepthook", "abort", "TrackedTransport",
           "Watchdog", "PeerFailure", "LivenessResponder", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV",
           "ABORT_EXIT_CODE", "abort_excepthook"]
