"""horotopo: Horovod-compatible allreduce over near-optimal packings of reduce/broadcast trees.

``import horotopo as hvd`` gives Horovod's API on NumPy (and CuPy) arrays; ``import
horotopo.torch as hvd`` is the drop-in for ``horovod.torch``. MPI is only touched after
``hvd.init()``, on horotopo's background thread.
"""
__version__ = "0.1.0"

from .api import *  # noqa: E402,F401,F403
from .api import __all__ as _api_all  # noqa: E402

__all__ = ["__version__", *_api_all]
