"""The probe: measure the links between the ranks and infer the measured topology.

- :mod:`horotopo.probe.measure`: :func:`probe` and :func:`measure_pairs`, the collective entry
  points over a transport, running the phases in order.
- :mod:`horotopo.probe.config`: :class:`ProbeConfig`, its presets and :class:`ProbeError`.
- :mod:`horotopo.probe.flows`: the measurements between ranks (ping-pong, timed flows, the
  adaptive test, the time budget).
- :mod:`horotopo.probe.phases`: the tests of each phase (pairs, groups, extensions, fans).
- :mod:`horotopo.probe.pairing`: which ranks the tests pair (circle-method rounds, group and
  extension tests).
- :mod:`horotopo.probe.cluster`: groups of ranks by their pairwise rates.
- :mod:`horotopo.probe.infer`: the pure inference from figures to the measured-topology
  document (shared bottlenecks, host caps).
- :mod:`horotopo.probe.report`: the text report.
- :mod:`horotopo.probe.hosts`: the probe by hosts for larger jobs (leaders in concurrent
  rounds, a trust test, group tests; linear in the hosts), with its pure half in
  :mod:`horotopo.probe.hostinfer` and :mod:`horotopo.probe.group` (a subset of the ranks as a
  transport).
"""
from .cluster import cluster_ranks
from .config import MODES, ProbeConfig, ProbeError
from .infer import build_document
from .measure import measure_pairs, probe
from .pairing import circle_rounds
from .report import format_report

__all__ = ["probe", "measure_pairs", "ProbeConfig", "ProbeError", "MODES", "build_document",
           "circle_rounds", "cluster_ranks", "format_report"]
