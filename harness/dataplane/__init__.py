"""The request path in front of the EPP: Envoy, a TCP proxy for faults, an ext_proc client and
closed-loop load.

May import `harness.base` and `harness.cluster` (certificates).
"""
