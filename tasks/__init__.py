"""Distributed compaction on Celery + Redis (DESIGN.md §6).

`tasks.app` builds the Celery app, `tasks.compaction` holds the canvas (compact_session →
chord(summarize_chunk ×N) → merge_and_audit), `tasks.jobs` the job records and the per-session
circuit breaker, `tasks.lease` the per-session lease, and `tasks.producer` the Python API used
by the CLI and the gateway to submit, watch and cancel jobs. Task arguments and results carry
ids only; transcript text lives in the object store and, for the lifetime of a job, in
short-lived Redis keys that are deleted when the job ends.
"""
