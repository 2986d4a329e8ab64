"""Request scheduling: pure functions over pod snapshots (DESIGN.md §2, Scheduling).

The handler builds an `LLMRequest` and calls `Scheduler.schedule(request, pods)` with one snapshot
of the datastore's pods; it gets a pod back or an `EppError` (429 shed, 503 no endpoints).
"""

from epp.scheduling.filters import FilterNode, LLMRequest
from epp.scheduling.scheduler import Scheduler, build_tree

__all__ = ["FilterNode", "LLMRequest", "Scheduler", "build_tree"]
