"""CLI for the gateway: `compactd serve`, `compactd tenants ...`, `compactd remote ...`.

Registered on the main app by importing this module from compactd/cli.py. `remote` talks to a
running gateway over HTTP (`--server`, `--api-key` or COMPACTD_SERVER / COMPACTD_API_KEY), so
an agent host needs no Redis or store access at all.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from compactd.cli import app, fail, out, print_json

tenants_app = typer.Typer(help="Manage gateway tenants and their API keys (talks to Redis).",
                          no_args_is_help=True)
remote_app = typer.Typer(help="Use a running gateway over HTTP (compactd.client).",
                         no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")
app.add_typer(remote_app, name="remote")


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8080,
    workers: Annotated[int, typer.Option("--workers", help="uvicorn worker processes.")] = 1,
) -> None:
    """Run the HTTP gateway (uvicorn). Settings come from COMPACTD_* / COMPACTD_GATEWAY_*."""
    import uvicorn

    from compactd.logs import configure_logging

    configure_logging()
    uvicorn.run("gateway.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_config=None, access_log=False, proxy_headers=False)


# --- tenants ---------------------------------------------------------------------------------


def _tenant_store() -> Any:
    import redis

    from compactd.settings import load_settings
    from gateway.models import GatewaySettings
    from gateway.tenants import TenantStore

    gw = GatewaySettings()
    pepper = gw.pepper.get_secret_value().encode() if gw.pepper else None
    return TenantStore(redis.Redis.from_url(load_settings().redis_url), pepper)


def _policy(raw: str | None) -> Any:
    from pydantic import ValidationError

    from gateway.models import TenantPolicy

    if raw is None:
        return TenantPolicy()
    try:
        return TenantPolicy.model_validate_json(raw)
    except ValidationError as exc:
        fail(f"invalid --policy: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}")


PolicyOpt = Annotated[str | None, typer.Option(
    "--policy", help='JSON, e.g. \'{"maxConcurrentJobs": 2, "requestsPerSecond": 5}\'')]


@tenants_app.command("create")
def tenants_create(
    tenant: Annotated[str, typer.Argument(help="Tenant id ([A-Za-z0-9._-]{1,128}).")],
    name: Annotated[str | None, typer.Option("--name", help="Display name.")] = None,
    policy: PolicyOpt = None,
) -> None:
    """Create a tenant; prints its API key and webhook secret ONCE (only a hash is kept)."""
    from gateway.tenants import TenantExists
    from storage.errors import InvalidId

    try:
        creds = _tenant_store().create(tenant, name=name, policy=_policy(policy))
    except (TenantExists, InvalidId) as exc:
        fail(str(exc))
    print_json({"tenant": creds.tenant, "apiKey": creds.api_key,
                "webhookSecret": creds.webhook_secret})


@tenants_app.command("list")
def tenants_list() -> None:
    """All tenants with their policy (never keys)."""
    print_json([t.to_json() for t in _tenant_store().list()])


@tenants_app.command("rotate-key")
def tenants_rotate(
    tenant: Annotated[str, typer.Argument()],
    webhook_secret: Annotated[bool, typer.Option(
        "--webhook-secret", help="Also issue a new webhook secret.")] = False,
) -> None:
    """Issue a new API key (the old one stops working immediately)."""
    from gateway.tenants import TenantNotFound

    try:
        creds = _tenant_store().rotate_key(tenant, webhook_secret=webhook_secret)
    except TenantNotFound:
        fail(f"no tenant {tenant!r}")
    print_json({"tenant": creds.tenant, "apiKey": creds.api_key,
                "webhookSecret": creds.webhook_secret})


@tenants_app.command("disable")
def tenants_disable(tenant: Annotated[str, typer.Argument()]) -> None:
    """Refuse the tenant's key (401) until `enable`; data and jobs stay."""
    _set_disabled(tenant, True)


@tenants_app.command("enable")
def tenants_enable(tenant: Annotated[str, typer.Argument()]) -> None:
    """Accept the tenant's key again."""
    _set_disabled(tenant, False)


def _set_disabled(tenant: str, disabled: bool) -> None:
    from gateway.tenants import TenantNotFound

    try:
        _tenant_store().set_disabled(tenant, disabled)
    except TenantNotFound:
        fail(f"no tenant {tenant!r}")
    out.print(f"tenant {tenant} {'disabled' if disabled else 'enabled'}")


@tenants_app.command("set-policy")
def tenants_set_policy(tenant: Annotated[str, typer.Argument()], policy: PolicyOpt = None
                       ) -> None:
    """Replace the tenant's policy overrides (unset fields use the server defaults)."""
    from gateway.tenants import TenantNotFound

    try:
        _tenant_store().set_policy(tenant, _policy(policy))
    except TenantNotFound:
        fail(f"no tenant {tenant!r}")
    out.print(f"policy of {tenant} updated")


# --- remote ----------------------------------------------------------------------------------

Server = Annotated[str, typer.Option("--server", envvar="COMPACTD_SERVER",
                                     help="Gateway base URL.")]
ApiKey = Annotated[str, typer.Option("--api-key", envvar="COMPACTD_API_KEY",
                                     help="Tenant API key.")]


def _client(server: str, api_key: str) -> Any:
    from compactd.client import CompactdClient

    return CompactdClient(server, api_key)


def _run(fn: Any) -> Any:
    from compactd.client import CompactdAPIError

    try:
        return fn()
    except CompactdAPIError as exc:
        fail(str(exc), code=1)
    except Exception as exc:  # connection errors and the like: one clean line, exit 1
        fail(f"{type(exc).__name__}: {exc}", code=1)


@remote_app.command("upload")
def remote_upload(session: Annotated[str, typer.Argument()],
                  file: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
                  server: Server, api_key: ApiKey) -> None:
    """Upload (create or replace) a session transcript from a JSONL file."""
    with _client(server, api_key) as c:
        print_json(_run(lambda: c.put_transcript(session, file.read_bytes())))


@remote_app.command("submit")
def remote_submit(
    session: Annotated[str, typer.Argument()], server: Server, api_key: ApiKey,
    trigger: Annotated[str, typer.Option("--trigger")] = "manual",
    keep_recent: Annotated[int | None, typer.Option("--keep-recent")] = None,
    reserve: Annotated[int | None, typer.Option("--reserve")] = None,
    window: Annotated[int | None, typer.Option("--window")] = None,
    instructions: Annotated[str | None, typer.Option("--instructions")] = None,
    callback_url: Annotated[str | None, typer.Option("--callback-url")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the job to end.")] = False,
) -> None:
    """Submit a compaction job for a session; prints the job record."""
    with _client(server, api_key) as c:
        job = _run(lambda: c.submit_compaction(
            session, trigger=trigger, keep_recent_tokens=keep_recent, reserve_tokens=reserve,
            context_window=window, instructions=instructions, callback_url=callback_url,
            idempotency_key=idempotency_key))
        if wait:
            job = _run(lambda: c.wait_job(job["jobId"]))
        print_json(job)
        if job.get("state") in ("failed", "superseded"):
            raise typer.Exit(1)


@remote_app.command("status")
def remote_status(job_id: Annotated[str, typer.Argument()], server: Server, api_key: ApiKey
                  ) -> None:
    """A job record."""
    with _client(server, api_key) as c:
        print_json(_run(lambda: c.get_job(job_id)))


@remote_app.command("cancel")
def remote_cancel(job_id: Annotated[str, typer.Argument()], server: Server, api_key: ApiKey
                  ) -> None:
    """Cancel a job."""
    with _client(server, api_key) as c:
        print_json(_run(lambda: c.cancel_job(job_id)))


@remote_app.command("jobs")
def remote_jobs(session: Annotated[str, typer.Argument()], server: Server, api_key: ApiKey
                ) -> None:
    """Jobs of a session, newest first."""
    with _client(server, api_key) as c:
        print_json(_run(lambda: c.list_jobs(session)))


@remote_app.command("context")
def remote_context(session: Annotated[str, typer.Argument()], server: Server, api_key: ApiKey,
                   format: Annotated[str, typer.Option("--format")] = "pi") -> None:
    """The model view (pi | agent | openai | anthropic)."""
    with _client(server, api_key) as c:
        print_json(_run(lambda: c.get_context(session, format)))


@remote_app.command("transcript")
def remote_transcript(session: Annotated[str, typer.Argument()], server: Server,
                      api_key: ApiKey) -> None:
    """Print the raw live transcript (JSONL)."""
    with _client(server, api_key) as c:
        data, _ = _run(lambda: c.get_transcript(session))
        sys.stdout.buffer.write(data)
