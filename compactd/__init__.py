"""compactd: LLM context compaction as distributed Celery workers."""
