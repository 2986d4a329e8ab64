"""Talking to the model servers behind the pool (today: probing their /metrics pages)."""
