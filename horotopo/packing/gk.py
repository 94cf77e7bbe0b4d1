"""Placeholder until the packing lands (being written now)."""
from __future__ import annotations


def pack(topology, **kwargs):
    raise NotImplementedError("horotopo.packing.pack is being written")
