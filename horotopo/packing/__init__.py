"""Tree packing: the fractional packing of reduce/broadcast tree pairs that the Plan is cut from.

Modules: ``model`` (columns, loads, the ring baseline), ``arborescence`` (the fast min-cost
arborescence oracle), ``gk`` (Garg-Konemann multiplicative weights, the dual bound, and the exact
LP re-solve of the kept trees).
"""
from .model import ArcModel, Packing, TreeRate, ring_packing, ring_parents, validate_arborescence
from .gk import pack

__all__ = ["ArcModel", "Packing", "TreeRate", "pack", "ring_packing", "ring_parents",
           "validate_arborescence"]
