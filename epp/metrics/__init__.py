"""Prometheus metrics of the EPP, with upstream's names (epp-behaviour.md §7.1).

Everything registers on a `CollectorRegistry` the caller passes in: there is no module-level
registry, so tests and several EPPs in one process never share counters.
"""

from epp.metrics.pool import PoolCollector
from epp.metrics.requests import UNKNOWN_MODEL, RequestMetrics

__all__ = ["UNKNOWN_MODEL", "PoolCollector", "RequestMetrics"]
