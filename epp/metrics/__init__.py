"""Prometheus metrics of the EPP, with upstream's names: v0.3.0's for the v1alpha2 pool group
(epp-behaviour.md §7.1), v1.5.0's for v1 (reference/upstream-v1.md §e).

Everything registers on a `CollectorRegistry` the caller passes in: there is no module-level
registry, so tests and several EPPs in one process never share counters.
"""

from epp.metrics.pool import PoolCollector
from epp.metrics.requests import UNKNOWN_MODEL, RequestMetrics
from epp.metrics.scheduling import TimedScheduler

__all__ = ["UNKNOWN_MODEL", "PoolCollector", "RequestMetrics", "TimedScheduler"]
