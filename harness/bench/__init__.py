"""The routing benchmark (``harness bench routing``): workloads, policies, load replay and report."""
