"""How arrays travel: the byte view a transport sends (no MPI here, no GPU package either).

The transport sits below the GPU package (GPU staging is a transport decorator above it), so
what the transport needs to know about dtypes lives here, and :mod:`horotopo.gpu` re-exports it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["wire_view"]


def wire_view(array: Any) -> Any:
    """The array as MPI can send it: bfloat16 viewed as uint16, everything else unchanged.

    mpi4py cannot take a bfloat16 buffer ("cannot include dtype 'E' in a buffer"); the bits are
    what travels, and the reduction (:func:`horotopo.gpu.elementwise.reduce_arrays`) knows them
    as bfloat16. Works for NumPy (ml_dtypes) and CuPy arrays alike.
    """
    if getattr(array.dtype, "name", None) == "bfloat16":
        return array.view(np.uint16) if isinstance(array, np.ndarray) else array.view("uint16")
    return array
