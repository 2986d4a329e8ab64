"""Serving the EPP: flags, TLS, health, the metrics port, the task supervisor and the runner."""
