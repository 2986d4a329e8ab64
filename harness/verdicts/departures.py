"""The conformance vocabulary: which tests are EPP-agnostic, our deliberate departures from upstream,
and upstream's known bugs, each with a name a report can print.

Three pytest markers (registered by ``harness.plugin.conformance``):

* ``@pytest.mark.epp_agnostic`` — the test drives the system only through Envoy and the API server
  (and the simulators' admin ports), never through our EPP's ``/debug/datastore`` or flags; so it
  runs against any EPP command line (``--epp-command``, ``harness conformance``).
* ``@pytest.mark.departure("name")`` — the test checks a behaviour we chose on purpose where upstream
  v0.3.0 does something else (DESIGN.md wins over upstream). An EPP that fails it *differs by design*.
* ``@pytest.mark.upstream_bug("name")`` — the test checks behaviour upstream v0.3.0 gets wrong by a
  known bug (epp-behaviour.md §9, or found by this suite). An EPP that fails it shows that bug.

* ``@pytest.mark.needs("capability")`` — the test checks something only an EPP with that capability
  can do (picking by the pods' load, serving a model name as other models ...). An EPP under test
  that says it lacks the capability (``EppCommand.lacks``: its flag profile's, e.g. v1.6.0's
  lightweight round-robin ``lwepp``, plus ``--epp-lacks``) skips the test as *not applicable*, so
  it is reported as such and never as a FAIL; every other EPP runs it.

The names are the keys below; a marker with another name fails collection, so a report never prints
a label nobody defined.
"""

from __future__ import annotations

from typing import Final

EPP_AGNOSTIC: Final = "epp_agnostic"
DEPARTURE: Final = "departure"
UPSTREAM_BUG: Final = "upstream_bug"
NEEDS: Final = "needs"

DEPARTURES: Final[dict[str, str]] = {
    "readable-error-bodies": "errors carry a one-line JSON message (upstream v0.3.0: empty body)",
    "503-no-endpoints": "no ready pod is 503 (upstream v0.3.0: 429, as for shedding)",
    "bodyless-routing": "bodyless requests (GET /v1/models) are routed to a pool pod",
    "models-relisted-after-pool-recreation": "a pool deleted and re-created serves its models again",
    "staleness": "a pod whose metrics went stale never wins over a fresh one (upstream #336)",
    "body-bytes-preserved": (
        "the model name is rewritten in place, every other byte reaches the model server as the client "
        "sent it (upstream v0.3.0 re-marshals the body, and rejects numbers a float64 cannot hold)"
    ),
}

UPSTREAM_BUGS: Final[dict[str, str]] = {
    "request-error-total-never-incremented": (
        "inference_model_request_error_total is registered but never incremented (v0.3.0)"
    ),
    "713-resync-adds-deleting-pods": "a pool resync adds pods already marked for deletion (upstream #713)",
    "1275-objects-bind-by-pool-name": (
        "objectives and models bound to a same-named pool of the other API group apply to this one "
        "(upstream #1275; v0.3.0 ignores poolRef.group)"
    ),
    "optional-kinds-forbidden-never-serves": (
        "a Role without the optional kinds (InferenceObjective, InferenceModelRewrite) leaves the EPP "
        "NOT_SERVING for good, then it exits when its cache sync times out (GIE v1.5.0 and "
        "llm-d-router: their start-up check ignores RBAC and controller-runtime waits for every "
        "informer; the class of upstream #1737)"
    ),
}


CAPABILITIES: Final[dict[str, str]] = {
    "load-aware-picking": "picks by the pods' load (queue, KV cache) scraped from their metrics",
    "load-shedding": "sheds requests of low criticality with 429 while every pod is saturated",
    "model-aware-routing": (
        "reads the request's model and the cluster's model objects: serves a name as its target "
        "models (rewriting the body), refuses an unknown one"
    ),
    "request-metrics": "publishes per-request metrics on its /metrics",
    "request-validation": "parses the OpenAI body and refuses a malformed one with 400",
    "leader-election": (
        "--ha-enable-leader-election: only the Lease holder reports SERVING, and the next replica takes "
        "over when it goes"
    ),
    "test-plugins": (
        "upstream's test plugins for gateway conformance: the test-epp-endpoint-selection header picks "
        "the endpoint, and x-conformance-test-served-endpoint echoes the endpoint that served"
    ),
}


def describe(kind: str, name: str) -> str:
    """The one-line description of a departure, upstream bug or capability (``kind``: a marker name)."""
    catalogue = {DEPARTURE: DEPARTURES, UPSTREAM_BUG: UPSTREAM_BUGS, NEEDS: CAPABILITIES}[kind]
    return catalogue[name]
