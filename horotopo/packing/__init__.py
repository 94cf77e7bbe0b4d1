"""Tree packing: the fractional packing of reduce/broadcast tree pairs that the Plan is cut from.

Modules: ``model`` (columns, loads, the ring baseline), ``arborescence`` (the fast min-cost
arborescence oracle), ``gk`` (Garg-Konemann multiplicative weights, the dual bound, and the exact
LP re-solve of the kept trees), ``certificate`` (the check that the bound is not below the
achieved rate, and the unfloored gap).
"""
from .certificate import CertificateError, check_certificate, format_percent, plural
from .model import (ArcModel, Packing, TreeRate, ring_packing, ring_parents,
                    validate_arborescence)
from .gk import pack, start_bound

__all__ = ["ArcModel", "CertificateError", "Packing", "TreeRate", "check_certificate",
           "format_percent", "pack", "plural", "ring_packing", "ring_parents", "start_bound",
           "validate_arborescence"]
