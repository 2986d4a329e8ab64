"""The EPP-agnostic scenarios, shipped with the harness: `harness conformance` runs them against any
EPP command (``pytest --pyargs harness.scenarios.conformance --epp-command=...`` does the same), and the
project's own tests/e2e imports each module to run it against our EPP.

Each module drives the system only through Envoy, the API server and the simulators' admin ports, and
judges by what reaches which pod. Their fixtures come from the harness's pytest plugin.
"""
