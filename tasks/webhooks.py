"""Webhook delivery on job end (filled in by the gateway work; a no-op without a callback)."""

from __future__ import annotations


def job_ended(job_id: str) -> None:
    """Called once per job when it reaches a final state. Must never block or raise."""
    return None
