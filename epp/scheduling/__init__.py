"""Request scheduling: pure functions over pod snapshots (DESIGN.md §2, Scheduling).

The handler builds an `LLMRequest` and calls `rank(request, pods, limit)` with one snapshot of the
datastore's pods; it gets the pick back followed by up to `limit - 1` fallbacks from the same
decision (`schedule` gives the pick alone), or an `EppError` (429 shed, 503 no endpoints). Two schedulers
share that interface: the v0.3.0 filter tree (`Scheduler`) and the weighted scorers
(`ScorerScheduler`); `new_scheduler` builds the one the configuration names.
"""

import random
import time
from collections.abc import Callable

from epp.config import SCORER, SchedulerConfig
from epp.scheduling.filters import FilterNode, LLMRequest
from epp.scheduling.scheduler import Scheduler, build_tree
from epp.scheduling.scorers import ScorerScheduler


def new_scheduler(
    config: SchedulerConfig,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    *,
    pool_name: str = "",
) -> Scheduler | ScorerScheduler:
    """The scheduler `config.kind` names: the v0.3.0 filter tree or the scorer scheduler."""
    if config.kind == SCORER:
        return ScorerScheduler(config, rng, clock, pool_name=pool_name)
    return Scheduler(config, rng, clock, pool_name=pool_name)


__all__ = ["FilterNode", "LLMRequest", "Scheduler", "ScorerScheduler", "build_tree", "new_scheduler"]
