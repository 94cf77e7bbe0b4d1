"""Groups of ranks by their pairwise rates: the probe's clustering (pure, no transport).

Networks are nested (ranks on a host, hosts in a rack, racks behind a spine), and each level
shows as a gap between the rates of the pairs it joins and the pairs it separates. The probe
cuts there:

- :func:`cluster_ranks`: single linkage cut at the widest gap between rate levels, so a
  uniform network stays one group.
- :func:`cluster_levels`: the same cut at every such gap, finest first.

:func:`as_matrix` is the one reading of a rate matrix (``None`` for the diagonal) that the
inference shares.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np

from ..params import PROBE

__all__ = ["cluster_ranks", "cluster_levels", "as_matrix", "single_linkage_groups"]


def as_matrix(bandwidth: Any) -> np.ndarray:
    """``bandwidth`` (n x n, ``None`` where unknown) as a float array with NaN for ``None``."""
    b = np.array([[np.nan if v is None else float(v) for v in row] for row in bandwidth])
    if b.ndim != 2 or b.shape[0] != b.shape[1]:
        raise ValueError(f"bandwidth must be a square matrix, got shape {b.shape}")
    return b


def _symmetric(bandwidth: Any) -> np.ndarray:
    b = as_matrix(bandwidth)
    # The geometric mean of the two directions: an asymmetric uplink still stands out (0.2
    # one way and 0.9 the other is 0.42 against 1.0 inside a rack), and one direction that
    # measured low (the usual way measurements go wrong) moves the pair half as far.
    with np.errstate(invalid="ignore"):
        return np.sqrt(b * b.T)


def single_linkage_groups(s: np.ndarray, threshold: float) -> List[List[int]]:
    """Connected components of the pairs at or above ``threshold`` (single linkage)."""
    n = s.shape[0]
    parent = list(range(n))

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for i, j in zip(*np.triu_indices(n, 1)):
        if s[i, j] >= threshold:
            parent[find(int(i))] = find(int(j))
    groups: Dict[int, List[int]] = {}
    for v in range(n):
        groups.setdefault(find(v), []).append(v)
    return sorted(groups.values(), key=lambda g: g[0])


def _levels(bandwidth: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(symmetric rates, distinct pair rates high to low, ratios between neighbours)."""
    s = _symmetric(bandwidth)
    n = s.shape[0]
    iu = np.triu_indices(n, 1)
    values = np.sort(s[iu][np.isfinite(s[iu])])[::-1]
    if len(values) < 2 or values[-1] <= 0:
        return s, values, np.zeros(0)
    return s, values, values[:-1] / values[1:]


def cluster_ranks(bandwidth: Any, *, gap: float = PROBE.gap) -> List[List[int]]:
    """Groups of ranks that talk to each other faster than to the rest.

    Sorts the distinct pair rates, finds the widest ratio between consecutive levels and, if it
    is at least ``gap``, joins every pair above it (single linkage); the connected components
    are the groups. A network whose rates are all within ``gap`` of each other is one group.

    Parameters
    ----------
    bandwidth : n x n array-like
        ``bandwidth[i][j]`` is the rate ``i -> j`` alone; the diagonal is ignored.
    gap : float
        Smallest ratio between two rate levels that counts as structure rather than noise.

    Returns
    -------
    list of list of int
        Groups, each sorted, ordered by their lowest rank.
    """
    s, values, ratios = _levels(bandwidth)
    n = s.shape[0]
    if n < 3 or not len(ratios) or ratios.max() < gap:
        return [list(range(n))]
    k = int(np.argmax(ratios))
    return single_linkage_groups(s, math.sqrt(values[k] * values[k + 1]))


def cluster_levels(bandwidth: Any, *, gap: float = PROBE.gap) -> List[List[List[int]]]:
    """The groups at every gap of at least ``gap`` between rate levels, finest first.

    Networks are nested (ranks on a host, hosts in a rack, racks behind a spine): each gap
    between rate levels cuts one level. Partitions into a single group or into single ranks
    only are left out, as are repeats.
    """
    s, values, ratios = _levels(bandwidth)
    n = s.shape[0]
    out: List[List[List[int]]] = []
    if n < 3:
        return out
    for k in np.flatnonzero(ratios >= gap):
        part = single_linkage_groups(s, math.sqrt(values[k] * values[k + 1]))
        if 1 < len(part) < n and part not in out:
            out.append(part)
    return out
