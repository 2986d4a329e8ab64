"""InferenceModel scenarios (epp-behaviour.md §3.3, §9.7): oldest wins, removal by identity, namespaces.

Which object owns a modelName is visible twice: in the datastore view, and in the routed request,
whose body is rewritten to the owner's target model. "The model stays owned by the older object" is a
negative check: `eventually_consistent()` settles before it (the EPP has applied the write that could
have changed the owner), so it cannot pass vacuously.
"""

from __future__ import annotations

import json

from harness.beds.testbed import TestBed

from .support import MODEL

OTHER_POOL = "other-pool"


def serving(bed: TestBed) -> None:
    bed.start_epp()
    bed.eventually_consistent()
    bed.apply_pool()
    bed.eventually_consistent()
    bed.add_pod("p1")
    bed.eventually_consistent()


def routed_target(bed: TestBed, model: str) -> str:
    """The model name the request was rewritten to (the owning object's target)."""
    result = bed.route(model)
    assert result.status == 200, result.message
    assert result.body is not None, "expected a rewritten body"
    target: str = json.loads(result.body)["model"]
    return target


def created_at(obj: dict[str, object]) -> str:
    metadata = obj["metadata"]
    assert isinstance(metadata, dict)
    return str(metadata["creationTimestamp"])


def test_two_models_claiming_one_model_name_oldest_wins_then_the_next_is_promoted(testbed: TestBed) -> None:
    serving(testbed)
    first = testbed.apply_model("first", MODEL, criticality="Critical", targets=[("chat-first", 100)])
    testbed.eventually_consistent()
    # creationTimestamp has one-second resolution: make the second claimant strictly younger.
    testbed.eventually_server_time_after(created_at(first))
    second = testbed.apply_model("second", MODEL, criticality="Critical", targets=[("chat-second", 100)])
    testbed.eventually_consistent()
    assert created_at(second) > created_at(first)
    testbed.eventually_server_time_after(created_at(second))
    third = testbed.apply_model("third", MODEL, criticality="Critical", targets=[("chat-third", 100)])
    testbed.eventually_consistent()
    assert created_at(third) > created_at(second)
    assert testbed.datastore_models() == {MODEL: "first"}
    assert routed_target(testbed, MODEL) == "chat-first"

    testbed.apply_model("second", MODEL, criticality="Critical", targets=[("chat-second-v2", 100)])
    testbed.eventually_consistent()  # an update of a younger claimant changes nothing
    assert testbed.datastore_models() == {MODEL: "first"}

    testbed.delete_model("first")
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "second"}
    assert routed_target(testbed, MODEL) == "chat-second-v2"

    testbed.delete_model("second")
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "third"}
    assert routed_target(testbed, MODEL) == "chat-third"

    testbed.delete_model("third")
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {}
    testbed.assert_not_declared(MODEL)  # deleted means undeclared (upstream #393)


def test_model_moved_to_another_pool_leaves_and_frees_its_model_name(testbed: TestBed) -> None:
    serving(testbed)
    old = testbed.apply_model("old", MODEL, criticality="Critical", targets=[("chat-old", 100)])
    testbed.eventually_consistent()
    testbed.eventually_server_time_after(created_at(old))
    testbed.apply_model("young", MODEL, criticality="Critical", targets=[("chat-young", 100)])
    testbed.eventually_consistent()
    testbed.apply_model("unrelated", "summarise", criticality="Critical")
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "old", "summarise": "unrelated"}

    # Another pool's model with a colliding modelName must not evict ours (#393).
    testbed.apply_model("elsewhere", MODEL, criticality="Critical", pool=OTHER_POOL)
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "old", "summarise": "unrelated"}
    testbed.delete_model("elsewhere")
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "old", "summarise": "unrelated"}

    testbed.apply_model("old", MODEL, criticality="Critical", targets=[("chat-old", 100)], pool=OTHER_POOL)
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "young", "summarise": "unrelated"}
    assert routed_target(testbed, MODEL) == "chat-young"

    testbed.apply_model("unrelated", "summarise", criticality="Critical", pool=OTHER_POOL)
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "young"}
    testbed.assert_not_declared("summarise")

    testbed.apply_model("unrelated", "summarise", criticality="Critical")  # and back again
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: "young", "summarise": "unrelated"}


def test_model_in_another_namespace_is_ignored(testbed: TestBed) -> None:
    serving(testbed)
    elsewhere = testbed.create_namespace("b")
    testbed.eventually_consistent()
    # Older than ours and naming a pool with our pool's name: still not ours.
    stranger = testbed.apply_model(
        MODEL, criticality="Critical", targets=[("chat-stranger", 100)], namespace=elsewhere
    )
    testbed.eventually_consistent()
    testbed.apply_model("solo", "only-there", criticality="Critical", namespace=elsewhere)
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {}
    testbed.assert_not_declared(MODEL)
    testbed.assert_not_declared("only-there")

    testbed.eventually_server_time_after(created_at(stranger))
    testbed.apply_model(MODEL, criticality="Critical", targets=[("chat-ours", 100)])
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: MODEL}
    assert routed_target(testbed, MODEL) == "chat-ours"

    testbed.delete_model(MODEL, namespace=elsewhere)  # deleting the stranger touches nothing here
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {MODEL: MODEL}
    assert {m["namespace"] for m in testbed.view()["models"]} == {testbed.namespace}
