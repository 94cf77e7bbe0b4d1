"""The probe: measure the links between the ranks and infer the measured topology.

- :mod:`horotopo.probe.measure`: the collective measurements over a transport, :func:`probe`.
- :mod:`horotopo.probe.infer`: the pure inference from figures to the measured-topology
  document (clustering, shared bottlenecks, host caps) and the text report.
"""
from .infer import build_document, circle_rounds, cluster_ranks, format_report
from .measure import MODES, ProbeConfig, ProbeError, measure_pairs, probe

__all__ = ["probe", "measure_pairs", "ProbeConfig", "ProbeError", "MODES", "build_document", "circle_rounds",
           "cluster_ranks", "format_report"]
