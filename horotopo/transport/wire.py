"""How data travels: the byte view of arrays a transport sends, and the plain encoding of the
control plane's messages (no MPI here, no GPU package either).

The transport sits below the GPU package (GPU staging is a transport decorator above it), so
what the transport needs to know about dtypes lives here, and :mod:`horotopo.gpu` re-exports it.

Control messages (negotiation, the bootstrap's settings, the probe's figures, the adaptive
layer's exchanges) are values, never code: :func:`encode` writes them as JSON with a few
tagged forms (tuples, dicts with keys other than strings, numeric arrays, bytes) and
:func:`decode` reads them back, refusing more than :data:`MAX_CONTROL_BYTES` or nesting deeper
than :data:`MAX_DEPTH`. Unlike unpickling, reading a peer's message can build nothing but
plain values. Pickle stays only where Horovod's API asks for arbitrary objects
(``broadcast_object``, ``allgather_object``).
"""
from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

__all__ = ["wire_view", "encode", "decode", "WireError", "MAX_CONTROL_BYTES", "MAX_DEPTH"]

#: The largest control message :func:`decode` reads (a plan or a probe's figures at thousands
#: of ranks is a few MiB).
MAX_CONTROL_BYTES = 64 << 20
#: The deepest nesting :func:`decode` reads (the control messages nest a few levels).
MAX_DEPTH = 32

# The tags of the forms JSON has no word for: {tag: payload}, one key.
_TUPLE, _DICT, _PAIRS, _ARRAY, _BYTES = "t", "d", "m", "a", "b"


class WireError(ValueError):
    """A control message that cannot be encoded (not a plain value) or decoded (too large,
    too deep, or not this encoding)."""


def wire_view(array: Any) -> Any:
    """The array as MPI can send it: bfloat16 viewed as uint16, everything else unchanged.

    mpi4py cannot take a bfloat16 buffer ("cannot include dtype 'E' in a buffer"); the bits are
    what travels, and the reduction (:func:`horotopo.gpu.elementwise.reduce_arrays`) knows them
    as bfloat16. Works for NumPy (ml_dtypes) and CuPy arrays alike.
    """
    if getattr(array.dtype, "name", None) == "bfloat16":
        return array.view(np.uint16) if isinstance(array, np.ndarray) else array.view("uint16")
    return array


def encode(value: Any) -> bytes:
    """``value`` as a control message: None, bool, int, float, str, bytes, lists, tuples,
    dicts and numeric NumPy arrays or scalars, nested.

    Raises
    ------
    WireError
        Something else (a class instance, a function) is in ``value``, or the message would
        exceed :data:`MAX_CONTROL_BYTES`.
    """
    data = json.dumps(_plain(value, 0), separators=(",", ":")).encode()
    if len(data) > MAX_CONTROL_BYTES:
        raise WireError(f"a control message of {len(data)} bytes exceeds the limit of "
                        f"{MAX_CONTROL_BYTES} bytes")
    return data


def decode(data: bytes, limit: Optional[int] = None) -> Any:
    """The value :func:`encode` wrote; ``limit`` bytes at most (:data:`MAX_CONTROL_BYTES`).

    Raises
    ------
    WireError
        The message is larger than the limit, nests deeper than :data:`MAX_DEPTH`, or is not
        this encoding.
    """
    limit = MAX_CONTROL_BYTES if limit is None else limit
    if len(data) > limit:
        raise WireError(f"a control message of {len(data)} bytes exceeds the limit of "
                        f"{limit} bytes")
    try:
        return _value(json.loads(data), 0)
    except RecursionError as exc:
        raise WireError("a control message nests too deeply") from exc
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError,
            IndexError) as exc:
        raise WireError(f"not a control message: {exc}") from exc


def _plain(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"a control message nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {_TUPLE: [_plain(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {_DICT: {k: _plain(v, depth + 1) for k, v in value.items()}}
        return {_PAIRS: [[_plain(k, depth + 1), _plain(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return {_ARRAY: [value.dtype.str, list(value.shape), value.ravel().tolist()]}
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES: bytes(value).hex()}
    raise WireError(f"a control message holds plain values only, not {type(value).__name__}")


def _value(node: Any, depth: int) -> Any:
    if depth > 2 * MAX_DEPTH:  # each tagged form takes two levels
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    depth += 1
    if isinstance(node, list):
        return [_value(v, depth) for v in node]
    if not isinstance(node, dict):
        return node
    (tag, body), = node.items()
    if tag == _TUPLE:
        return tuple(_value(v, depth) for v in body)
    if tag == _DICT:
        return {k: _value(v, depth) for k, v in body.items()}
    if tag == _PAIRS:
        return {_value(k, depth): _value(v, depth) for k, v in body}
    if tag == _ARRAY:
        dtype = np.dtype(body[0])
        if dtype.kind not in "biuf":
            raise ValueError(f"array of dtype {dtype} in a control message")
        return np.asarray(body[2], dtype=dtype).reshape(body[1])
    if tag == _BYTES:
        return bytes.fromhex(body)
    raise ValueError(f"unknown form {tag!r}")
