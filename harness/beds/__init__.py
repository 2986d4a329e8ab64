"""Test beds that put the parts together: TestBed (in-process EPP), Stack (EPP process + Envoy),
the cluster side of a test, the fault rig and EPP replicas.

May import every part below it; never `stress`, `scenarios`, `plugin` or `cli`.
"""
