"""The Celery app, configured from `CompactdSettings` (COMPACTD_* environment).

Why these settings (see reference/celery-s3-notes.md §0, §1.3):

* JSON only, small results: task payloads are ids, and nothing pickled can smuggle objects in.
* At-least-once delivery (`task_acks_late`, `task_reject_on_worker_lost`, prefetch 1): a worker
  killed mid-task must not lose the job; every task is idempotent instead.
* The Redis visibility timeout must be above the longest task, else a long LLM call is
  delivered a second time while it still runs. It is set in all three places Celery reads it.
  `COMPACTD_VISIBILITY_TIMEOUT` (seconds) overrides it; tests use a few seconds to exercise
  redelivery after SIGKILL.
* `worker_cancel_long_running_tasks_on_connection_loss`: on a broker blip the late-acked copy
  is redelivered, so the local copy must stop rather than run twice in parallel.
* Events on (`worker_send_task_events`, `task_send_sent_event`) so Flower shows queued and
  running work; `result_extended` stays off so arguments are never copied into results.
* Two queues: `compactd.interactive` (a user is waiting) and `compactd.background` (the
  default). A job's tasks all run on the queue the job was submitted to.
"""

from __future__ import annotations

import os

from celery import Celery, signals
from kombu.entity import Queue

from compactd.logs import configure_logging
from compactd.settings import load_settings

INTERACTIVE_QUEUE = "compactd.interactive"
BACKGROUND_QUEUE = "compactd.background"
WEBHOOK_QUEUE = "compactd.webhooks"
QUEUES = (INTERACTIVE_QUEUE, BACKGROUND_QUEUE)
DEFAULT_VISIBILITY_TIMEOUT = 3600


def visibility_timeout() -> int:
    """Broker visibility timeout in seconds (env override for tests and operators)."""
    raw = os.environ.get("COMPACTD_VISIBILITY_TIMEOUT")
    return int(raw) if raw else DEFAULT_VISIBILITY_TIMEOUT


def _restore_sweep(vt: int) -> dict[str, int]:
    """How often a live worker re-queues messages a dead worker left unacked. kombu's default
    sweep is ~100 s (interval 10 s x throttle 10), fine for a 1 h timeout but far too slow
    when the timeout is short (tests, or operators who want fast crash recovery)."""
    if vt >= 600:
        return {}
    return {"unacked_restore_interval": max(1, vt // 5), "unacked_restore_throttle": 1}


def make_app(redis_url: str | None = None) -> Celery:
    """Build the app. `redis_url` defaults to `COMPACTD_REDIS_URL` via the settings model."""
    url = redis_url or load_settings().redis_url
    vt = visibility_timeout()
    app = Celery("compactd", broker=url, backend=url,
                 include=["tasks.compaction", "tasks.webhooks"])
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        result_backend_always_retry=True,
        result_backend_max_retries=10,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_soft_shutdown_timeout=10.0,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": vt, "socket_timeout": 30,
                                  "health_check_interval": 25, **_restore_sweep(vt)},
        result_backend_transport_options={"visibility_timeout": vt},
        visibility_timeout=vt,
        redis_backend_health_check_interval=25,
        result_expires=24 * 3600,
        result_chord_expires=6 * 3600,
        result_extended=False,
        task_track_started=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_queues=[Queue(INTERACTIVE_QUEUE), Queue(BACKGROUND_QUEUE), Queue(WEBHOOK_QUEUE)],
        task_default_queue=BACKGROUND_QUEUE,
        task_routes={
            "tasks.compaction.*": {"queue": BACKGROUND_QUEUE},
        },
        worker_hijack_root_logger=False,
    )
    return app


app = make_app()


@signals.setup_logging.connect
def _json_logging(**_: object) -> None:
    """Workers log structured JSON (COMPACTD_LOG_FORMAT=text for humans) instead of Celery's
    default format, so every line carries job, tenant, session and stage."""
    configure_logging()
