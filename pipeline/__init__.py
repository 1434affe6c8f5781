"""The compaction engine: pure, deterministic steps shared by every runner.

Nothing in this package knows about Celery, Redis or object stores; the runners in
`compactd/` (embedded) and `tasks/` (distributed) call the same functions.
"""
