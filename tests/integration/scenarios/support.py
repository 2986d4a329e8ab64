"""The opening most scenarios share, with the oracle checked after every step as the rest of them."""

from __future__ import annotations

from typing import Any

from harness.beds.testbed import TestBed

MODEL = "chat"


def serving(testbed: TestBed, *pods: str, **pool: Any) -> None:
    """EPP running, then the pool, a Critical model and `pods`, each step checked by the oracle."""
    testbed.start_epp()
    testbed.eventually_consistent()
    testbed.apply_pool(**pool)
    testbed.eventually_consistent()
    testbed.apply_model(MODEL, criticality="Critical")
    testbed.eventually_consistent()
    for name in pods:
        testbed.add_pod(name)
        testbed.eventually_consistent()
