"""Pure request-side logic: resolve the model (the body itself is read by `epp.body`).

No I/O and no protobuf here, so every rule is table-testable. Failures are `EppError`s carrying the
one-line message the client sees.
"""

from __future__ import annotations

import random

from epp.api.types import InferenceModel
from epp.errors import ModelNotFound


def _one_line(text: str) -> str:
    return " ".join(text.split())


def not_found(model_name: str) -> ModelNotFound:
    return ModelNotFound(f"model {_one_line(model_name)[:256]} not found")


def pick_target(model: InferenceModel, rng: random.Random) -> str:
    """The model name to send upstream (epp-behaviour.md §6.5).

    No targetModels: the model itself (direct passthrough). Weights on the first entry: a weighted
    draw in [0, sum) where weight-0 entries never win. No weights: a uniform choice (#427).
    """
    targets = model.target_models
    if not targets:
        return model.model_name
    if targets[0].weight is None:
        return rng.choice(targets).name
    total = sum(t.weight or 0 for t in targets)
    if total <= 0:
        raise ModelNotFound(f"model {model.model_name} has no target model with a positive weight")
    r = rng.randrange(total)
    for t in targets:
        weight = t.weight or 0
        if r < weight:
            return t.name
        r -= weight
    raise AssertionError("unreachable: r < total")  # pragma: no cover
