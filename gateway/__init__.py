"""The multi-tenant HTTP gateway (FastAPI). `gateway.app.create_app` builds the ASGI app.

Nothing is imported here on purpose: `tasks.webhooks` uses `gateway.tenants` and must not pull
FastAPI into every worker.
"""
