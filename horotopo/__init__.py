"""horotopo: Horovod-compatible allreduce over near-optimal packings of reduce/broadcast trees.

``import horotopo as hvd`` gives Horovod's API on NumPy (and CuPy) arrays; ``import
horotopo.torch as hvd`` is the drop-in for ``horovod.torch``. MPI is only touched after
``hvd.init()``, on horotopo's background thread.
"""
from importlib import metadata as _metadata


def _installed_version() -> str:
    """The version setup.cfg declares, as the installed package's metadata records it."""
    try:
        return _metadata.version("horotopo")
    except _metadata.PackageNotFoundError:
        # Imported from a source tree that was never installed: no metadata exists to read.
        return "0+unknown"


__version__ = _installed_version()

from .api import *  # noqa: E402,F401,F403
from .api import __all__ as _api_all  # noqa: E402

__all__ = ["__version__", *_api_all]
