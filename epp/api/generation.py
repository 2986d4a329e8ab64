"""Which kinds the EPP watches for the pool group it serves, and how each becomes the one shape.

This table is the only place that knows there are two generations (DESIGN.md §1): everything past
the parse functions named here sees `epp.api.types` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epp.api import v1, v1alpha2
from epp.api.types import POOL_GROUPS

# What each kind is to the reconcilers.
POOL_LANE = "pool"
OBJECTIVE_LANE = "objective"
REWRITE_LANE = "rewrite"


@dataclass(frozen=True, slots=True)
class WatchedKind:
    lane: str  # POOL_LANE, OBJECTIVE_LANE or REWRITE_LANE
    group: str
    version: str
    plural: str
    parse: Callable[[Mapping[str, Any]], Any]
    # Optional kinds never stop the EPP: absent (no CRD) or forbidden (RBAC) means "serve without".
    optional: bool = False


@dataclass(frozen=True, slots=True)
class Generation:
    group: str
    pool: WatchedKind
    rules: tuple[WatchedKind, ...]  # objectives and rewrites, in the order they are watched


V1 = Generation(
    group=v1.GROUP,
    pool=WatchedKind(POOL_LANE, v1.GROUP, v1.VERSION, v1.POOLS, v1.pool_from_api),
    rules=(
        WatchedKind(
            OBJECTIVE_LANE,
            v1.OPTIONAL_GROUP,
            v1.OPTIONAL_VERSION,
            v1.OBJECTIVES,
            v1.objective_from_api,
            optional=True,
        ),
        WatchedKind(
            REWRITE_LANE,
            v1.OPTIONAL_GROUP,
            v1.OPTIONAL_VERSION,
            v1.REWRITES,
            v1.rewrite_from_api,
            optional=True,
        ),
    ),
)

V1ALPHA2 = Generation(
    group=v1alpha2.GROUP,
    pool=WatchedKind(POOL_LANE, v1alpha2.GROUP, v1alpha2.VERSION, v1alpha2.POOLS, v1alpha2.pool_from_api),
    # InferenceModel is required, as in v0.3.0; each one is a rewrite with its implied objective.
    rules=(
        WatchedKind(REWRITE_LANE, v1alpha2.GROUP, v1alpha2.VERSION, v1alpha2.MODELS, v1alpha2.model_from_api),
    ),
)

_BY_GROUP = {V1.group: V1, V1ALPHA2.group: V1ALPHA2}


def generation(pool_group: str) -> Generation:
    try:
        return _BY_GROUP[pool_group]
    except KeyError:
        raise ValueError(
            f"unknown pool group {pool_group!r}: expected one of {', '.join(POOL_GROUPS)}"
        ) from None
