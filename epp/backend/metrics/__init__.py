"""Per-pod metrics probing (DESIGN.md §2, Probing).

`spec` parses the metric-name flags, `parse` is the pure targeted scan of one /metrics page,
`fetch` is the HTTP I/O, and `refresher` owns one scrape loop per pod in the datastore.
"""

from epp.backend.metrics.fetch import MetricsFetcher, ScrapeError, new_scrape_session
from epp.backend.metrics.parse import MetricPlan, compile_metric_names, parse, parse_page
from epp.backend.metrics.refresher import Fetcher, PodRefreshers
from epp.backend.metrics.spec import MetricSpec, parse_metric_spec

__all__ = [
    "Fetcher",
    "MetricPlan",
    "MetricSpec",
    "MetricsFetcher",
    "PodRefreshers",
    "ScrapeError",
    "compile_metric_names",
    "new_scrape_session",
    "parse",
    "parse_metric_spec",
    "parse_page",
]
