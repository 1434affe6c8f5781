"""OpenAI and Anthropic summarizers against the scripted LLM server, over real HTTP.

No mocks: every test sends real requests to ``tests.support.llmserver`` on 127.0.0.1 and
checks what the server saw (requests, timings, concurrency) as well as what the caller got.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from compactd.providers import (
    AnthropicSummarizer,
    CallTimeouts,
    OpenAISummarizer,
    RetryPolicy,
    close_shared_client,
    configure_shared_client,
    shared_client,
)
from compactd.providers.anthropic import parse_message
from compactd.providers.http import parse_retry_after, scrub
from compactd.providers.openai import parse_chat_completion
from pipeline.summarizer import (
    CancelToken,
    ContextOverflowError,
    EmptySummaryError,
    OutputBudgetExhaustedError,
    Summarizer,
    SummarizerCancelledError,
    SummarizerError,
    SummarizerTimeoutError,
    SummaryRequest,
    TransientSummarizerError,
)
from tests.support.llmserver import REQUIRED_HEADINGS, Behavior, ScriptedLLMServer

FAST = RetryPolicy(min_wait=0.01, max_wait=0.05)
API_KEY = "sk-test-7Hq2ZpX9SECRETkey"

CONVERSATION = """[User]: Deploy billing from /srv/billing/deploy.sh. Never push to main.

[Assistant]: I will use the blue/green strategy and open a PR at https://git.example.com/acme/billing/pull/42.

[Tool result]: build 3f9a2b7c1d0e ok; staging at staging.acme.internal:8443

[User]: Don't touch the database. Now check job 123e4567-e89b-12d3-a456-426614174000 please."""

PREVIOUS = """## Goal
- Ship billing v2
## Decisions
- Chose Postgres 16 for the ledger
## Open TODOs
- Rotate the staging certificate
## Constraints/Rules
- Always run the smoke tests first
## Pending user asks
- Write the release notes
## Exact identifiers
- /etc/billing/ledger.toml"""


def make_request(
    *, conversation: str = CONVERSATION, previous: str | None = None, max_out: int = 2000
) -> SummaryRequest:
    return SummaryRequest(
        kind="history",
        system_prompt="You are a context summarization assistant. Output only the summary.",
        conversation=conversation,
        instructions="Produce the summary with the required headings.",
        max_output_tokens=max_out,
        previous_summary=previous,
    )


SummarizerFactory = Callable[..., OpenAISummarizer | AnthropicSummarizer]


def openai_factory(server: ScriptedLLMServer) -> SummarizerFactory:
    def make(**kwargs: object) -> OpenAISummarizer:
        return OpenAISummarizer(server.url, kwargs.pop("model", "gpt-test"), **kwargs)  # type: ignore[arg-type]

    return make


def anthropic_factory(server: ScriptedLLMServer) -> SummarizerFactory:
    def make(**kwargs: object) -> AnthropicSummarizer:
        return AnthropicSummarizer(server.url, kwargs.pop("model", "claude-test"), **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture(autouse=True)
def fresh_client() -> Iterator[None]:
    """Each test builds its own shared client, so pool state never leaks between tests."""
    close_shared_client()
    yield
    close_shared_client()


@pytest.fixture(params=["openai", "anthropic"])
def make(request: pytest.FixtureRequest, llm_server: ScriptedLLMServer) -> SummarizerFactory:
    """Both providers, for behaviour that must not depend on the wire format."""
    if request.param == "openai":
        return openai_factory(llm_server)
    return anthropic_factory(llm_server)


def cancel_after(token: CancelToken, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, token.cancel)
    timer.daemon = True
    timer.start()
    return timer


# --------------------------------------------------------------------------------------------
# Happy paths
# --------------------------------------------------------------------------------------------


def test_openai_happy_path_headers_body_usage(llm_server: ScriptedLLMServer) -> None:
    llm_server.expected_api_key = API_KEY  # a wrong or missing key would get a 401
    llm_server.script(Behavior.summary(cached_tokens=7))
    summarizer = OpenAISummarizer(
        llm_server.url, "gpt-test", api_key=API_KEY, max_output_tokens_cap=512
    )
    assert isinstance(summarizer, Summarizer)
    request = make_request(max_out=2000)

    result = summarizer.summarize(request)

    (seen,) = llm_server.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer <redacted>"
    assert seen.headers["content-type"] == "application/json"
    assert seen.body["model"] == "gpt-test"
    assert seen.body["max_tokens"] == 512  # min(request budget, model cap)
    assert seen.body["temperature"] == 0
    assert seen.body["messages"] == [
        {"role": "system", "content": request.system_prompt},
        {"role": "user", "content": request.user_prompt()},
    ]
    assert result.summarizer == "openai" and result.model == "gpt-test"
    assert result.attempts == 1
    positions = [result.text.index(h) for h in REQUIRED_HEADINGS]
    assert positions == sorted(positions)
    # The server reports prompt_tokens = len//4 + cached; input excludes the cached part.
    assert result.usage.cache_read_tokens == 7
    assert result.usage.input_tokens == len(request.user_prompt()) // 4
    assert result.usage.output_tokens == len(result.text) // 4


def test_openai_without_key_sends_no_authorization(llm_server: ScriptedLLMServer) -> None:
    OpenAISummarizer(llm_server.url, "local-model").summarize(make_request())
    (seen,) = llm_server.requests
    assert "authorization" not in seen.headers


def test_anthropic_happy_path_headers_body_usage(llm_server: ScriptedLLMServer) -> None:
    llm_server.expected_api_key = API_KEY
    llm_server.script(Behavior.summary(cached_tokens=11, cache_write_tokens=5))
    summarizer = AnthropicSummarizer(llm_server.url, "claude-test", api_key=API_KEY)
    request = make_request(max_out=1500)

    result = summarizer.summarize(request)

    (seen,) = llm_server.requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "<redacted>"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["content-type"] == "application/json"
    assert "authorization" not in seen.headers
    assert seen.body == {
        "model": "claude-test",
        "max_tokens": 1500,
        "system": request.system_prompt,
        "messages": [{"role": "user", "content": request.user_prompt()}],
        "temperature": 0,
    }
    assert result.summarizer == "anthropic" and result.attempts == 1
    assert result.usage.input_tokens == len(request.user_prompt()) // 4
    assert result.usage.cache_read_tokens == 11
    assert result.usage.cache_write_tokens == 5
    assert result.usage.output_tokens == len(result.text) // 4


def test_default_summary_is_built_from_the_prompt(llm_server: ScriptedLLMServer) -> None:
    result = OpenAISummarizer(llm_server.url, "m").summarize(make_request(previous=PREVIOUS))
    text = result.text
    lines = [line.strip() for line in text.splitlines()]
    for heading in REQUIRED_HEADINGS:
        assert lines.count(heading) == 1
    assert [lines.index(h) for h in REQUIRED_HEADINGS] == sorted(
        lines.index(h) for h in REQUIRED_HEADINGS
    )
    for identifier in (
        "/srv/billing/deploy.sh",
        "https://git.example.com/acme/billing/pull/42",
        "3f9a2b7c1d0e",
        "staging.acme.internal:8443",
        "123e4567-e89b-12d3-a456-426614174000",
        "/etc/billing/ledger.toml",
    ):
        assert identifier in text
    assert "Never push to main." in text and "Don't touch the database." in text
    pending = text.split("## Pending user asks", 1)[1].split("## Exact identifiers", 1)[0]
    assert "check job 123e4567-e89b-12d3-a456-426614174000" in pending
    # Everything from the previous summary survives.
    for kept in (
        "Ship billing v2",
        "Chose Postgres 16",
        "Rotate the staging certificate",
        "Always run the smoke tests first",
        "Write the release notes",
    ):
        assert kept in text


def test_missing_headings_behaviour_reaches_the_caller(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.missing_headings("## Exact identifiers"))
    text = AnthropicSummarizer(llm_server.url, "m").summarize(make_request()).text
    assert "## Exact identifiers" not in text and "## Decisions" in text


def test_slow_answer_within_the_deadline_succeeds(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.slow(0.3))
    summarizer = OpenAISummarizer(llm_server.url, "m", timeouts=CallTimeouts(total=3.0))
    assert summarizer.summarize(make_request()).attempts == 1


# --------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------


def test_429_retry_after_is_honoured(
    llm_server: ScriptedLLMServer, make: SummarizerFactory
) -> None:
    llm_server.script(Behavior.rate_limited(retry_after=1))
    result = make().summarize(make_request())  # default policy: backoff ~0.5 s < Retry-After
    first, second = llm_server.requests
    assert result.attempts == 2
    assert second.arrived - first.arrived >= 0.95


def test_503_http_date_retry_after_is_honoured(llm_server: ScriptedLLMServer) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    llm_server.script(Behavior.unavailable(retry_after=when))
    result = OpenAISummarizer(llm_server.url, "m", retry_policy=FAST).summarize(make_request())
    first, second = llm_server.requests
    assert result.attempts == 2
    assert second.arrived - first.arrived >= 0.9  # HTTP dates have 1 s resolution


def test_retry_after_is_capped(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.rate_limited(retry_after=120))
    policy = RetryPolicy(min_wait=0.01, max_wait=0.05, max_retry_after=0.3)
    started = time.monotonic()
    OpenAISummarizer(llm_server.url, "m", retry_policy=policy).summarize(make_request())
    assert time.monotonic() - started < 2.0


def test_500_twice_then_success(llm_server: ScriptedLLMServer, make: SummarizerFactory) -> None:
    llm_server.script(Behavior.server_error(), Behavior.server_error())
    result = make(retry_policy=FAST).summarize(make_request())
    assert result.attempts == 3
    assert [r.behavior for r in llm_server.requests] == ["error", "error", "reply"]


def test_always_500_gives_up_after_three_requests(
    llm_server: ScriptedLLMServer, make: SummarizerFactory
) -> None:
    summarizer = make(retry_policy=FAST)
    llm_server.always(summarizer.model, Behavior.server_error())
    with pytest.raises(TransientSummarizerError, match="HTTP 500"):
        summarizer.summarize(make_request())
    assert len(llm_server.requests) == 3


def test_anthropic_529_overloaded_is_transient(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.overloaded())
    result = AnthropicSummarizer(llm_server.url, "m", retry_policy=FAST).summarize(make_request())
    assert result.attempts == 2


def test_connection_refused_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    summarizer = OpenAISummarizer(f"http://127.0.0.1:{port}/v1", "m", retry_policy=FAST)
    with pytest.raises(TransientSummarizerError, match="ConnectError"):
        summarizer.summarize(make_request())


def test_fault_filtered_by_model(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.server_error(), model="flaky")
    steady = OpenAISummarizer(llm_server.url, "steady", retry_policy=FAST)
    flaky = OpenAISummarizer(llm_server.url, "flaky", retry_policy=FAST)
    assert steady.summarize(make_request()).attempts == 1
    assert flaky.summarize(make_request()).attempts == 2


def test_budget_stops_retrying(llm_server: ScriptedLLMServer) -> None:
    llm_server.always("m", Behavior.server_error())
    policy = RetryPolicy(min_wait=0.5, max_wait=1.0, budget=0.3)
    started = time.monotonic()
    with pytest.raises(TransientSummarizerError):
        OpenAISummarizer(llm_server.url, "m", retry_policy=policy).summarize(make_request())
    assert len(llm_server.requests) == 1  # the next wait would have ended past the budget
    assert time.monotonic() - started < 0.4


# --------------------------------------------------------------------------------------------
# Not retried
# --------------------------------------------------------------------------------------------


def test_overflow_is_not_retried(llm_server: ScriptedLLMServer, make: SummarizerFactory) -> None:
    llm_server.script(Behavior.overflow(), Behavior.summary())
    with pytest.raises(ContextOverflowError):
        make(retry_policy=FAST).summarize(make_request())
    assert len(llm_server.requests) == 1


def test_413_is_overflow(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(
        Behavior.error(413, {"type": "error", "error": {"type": "request_too_large"}})
    )
    with pytest.raises(ContextOverflowError):
        AnthropicSummarizer(llm_server.url, "m", retry_policy=FAST).summarize(make_request())
    assert len(llm_server.requests) == 1


def test_rate_limit_text_is_not_overflow(llm_server: ScriptedLLMServer) -> None:
    # "too many tokens" alone is an overflow pattern; the rate-limit exclusion must win.
    body = {"error": {"message": "Rate limit exceeded: too many tokens per minute"}}
    llm_server.script(Behavior.error(429, body))
    result = OpenAISummarizer(llm_server.url, "m", retry_policy=FAST).summarize(make_request())
    assert result.attempts == 2


def test_empty_answer_is_retried_once(
    llm_server: ScriptedLLMServer, make: SummarizerFactory
) -> None:
    summarizer = make(retry_policy=FAST)
    llm_server.always(summarizer.model, Behavior.empty())
    with pytest.raises(EmptySummaryError):
        summarizer.summarize(make_request())
    assert len(llm_server.requests) == 2  # one retry for an empty answer, not two


def test_empty_then_text_succeeds(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.empty(), Behavior.reply("## Decisions\n- ok"))
    result = OpenAISummarizer(llm_server.url, "m", retry_policy=FAST).summarize(make_request())
    assert result.attempts == 2 and result.text == "## Decisions\n- ok"


def test_length_with_empty_text_is_budget_exhausted(
    llm_server: ScriptedLLMServer, make: SummarizerFactory
) -> None:
    summarizer = make(retry_policy=FAST)
    llm_server.always(summarizer.model, Behavior.length_empty())
    with pytest.raises(OutputBudgetExhaustedError, match="2000 tokens"):
        summarizer.summarize(make_request(max_out=2000))
    assert len(llm_server.requests) == 1


def test_client_error_is_not_retried(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.error(404, {"error": {"message": "model 'nope' not found"}}))
    with pytest.raises(SummarizerError, match="HTTP 404: model 'nope' not found") as info:
        OpenAISummarizer(llm_server.url, "nope", retry_policy=FAST).summarize(make_request())
    assert type(info.value) is SummarizerError
    assert len(llm_server.requests) == 1


def test_non_json_200_is_an_error(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.error(200, "<html>captive portal</html>"))
    with pytest.raises(SummarizerError, match="non-JSON"):
        OpenAISummarizer(llm_server.url, "m", retry_policy=FAST).summarize(make_request())
    assert len(llm_server.requests) == 1


# --------------------------------------------------------------------------------------------
# Deadlines and cancellation
# --------------------------------------------------------------------------------------------


def test_hang_is_stopped_by_the_deadline(
    llm_server: ScriptedLLMServer, make: SummarizerFactory
) -> None:
    llm_server.script(Behavior.hang())
    summarizer = make(timeouts=CallTimeouts(total=1.0, read=30.0), retry_policy=FAST)
    started = time.monotonic()
    with pytest.raises(SummarizerTimeoutError, match="deadline"):
        summarizer.summarize(make_request())
    elapsed = time.monotonic() - started
    assert 0.95 <= elapsed < 1.5
    assert len(llm_server.requests) == 1  # a timed-out call is not retried


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers-and-body"])
def test_trickle_is_stopped_by_the_total_deadline(
    llm_server: ScriptedLLMServer, headers: bool
) -> None:
    # Every byte arrives well within the 0.5 s read timeout: only a total deadline stops this.
    # With the headers trickling too, httpx has not even produced a response object yet.
    llm_server.script(Behavior.trickle(interval=0.05, headers=headers))
    summarizer = OpenAISummarizer(
        llm_server.url, "m", timeouts=CallTimeouts(total=1.0, read=0.5), retry_policy=FAST
    )
    started = time.monotonic()
    with pytest.raises(SummarizerTimeoutError):
        summarizer.summarize(make_request())
    assert 0.95 <= time.monotonic() - started < 1.5
    assert [r.behavior for r in llm_server.requests] == ["trickle"]


def test_cancel_during_backoff_wait(llm_server: ScriptedLLMServer, make: SummarizerFactory) -> None:
    llm_server.script(Behavior.rate_limited(retry_after=10))
    token = CancelToken()
    cancel_after(token, 0.3)
    started = time.monotonic()
    with pytest.raises(SummarizerCancelledError):
        make().summarize(make_request(), cancel=token)
    assert time.monotonic() - started < 0.8
    assert len(llm_server.requests) == 1


def test_cancel_during_a_hanging_call(llm_server: ScriptedLLMServer) -> None:
    llm_server.script(Behavior.hang())
    token = CancelToken()
    cancel_after(token, 0.3)
    started = time.monotonic()
    with pytest.raises(SummarizerCancelledError):
        OpenAISummarizer(llm_server.url, "m").summarize(make_request(), cancel=token)
    assert time.monotonic() - started < 0.8


def test_cancelled_before_the_call_sends_nothing(llm_server: ScriptedLLMServer) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(SummarizerCancelledError):
        OpenAISummarizer(llm_server.url, "m").summarize(make_request(), cancel=token)
    assert llm_server.requests == []


# --------------------------------------------------------------------------------------------
# Secrets and prompt text stay out of errors, reprs and logs
# --------------------------------------------------------------------------------------------


def test_api_key_and_prompt_never_leak(
    llm_server: ScriptedLLMServer, make: SummarizerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    echo = CONVERSATION.splitlines()[0]
    llm_server.script(
        Behavior.error(503, {"error": {"message": f"upstream said {API_KEY} for: {echo}"}}),
        Behavior.error(401, {"error": {"message": f"Incorrect API key provided: {API_KEY}"}}),
    )
    summarizer = make(api_key=API_KEY, retry_policy=FAST)
    assert API_KEY not in repr(summarizer) and API_KEY not in str(summarizer)
    with caplog.at_level(logging.DEBUG), pytest.raises(SummarizerError) as info:
        summarizer.summarize(make_request())
    assert "HTTP 401" in str(info.value)
    assert len(llm_server.requests) == 2
    for text in (str(info.value), repr(info.value), caplog.text):
        assert API_KEY not in text
    assert "HTTP 503" in caplog.text  # the retry was logged ...
    assert "Deploy billing from /srv/billing" not in caplog.text  # ... without prompt


def test_prompt_echo_is_scrubbed_from_errors(llm_server: ScriptedLLMServer) -> None:
    secret_line = "[User]: my card number is 4111 1111 1111 1111 and the vault code is 8812"
    request = make_request(conversation=secret_line)
    llm_server.script(
        Behavior.error(422, {"error": {"message": f"invalid input: {request.user_prompt()}"}})
    )
    with pytest.raises(SummarizerError) as info:
        OpenAISummarizer(llm_server.url, "m").summarize(request)
    assert "4111 1111" not in str(info.value) and "vault code" not in str(info.value)
    assert "invalid input" in str(info.value)


# --------------------------------------------------------------------------------------------
# The shared client
# --------------------------------------------------------------------------------------------


def test_parallel_calls_share_one_pooled_client(llm_server: ScriptedLLMServer) -> None:
    llm_server.latency = 0.5
    summarizer = OpenAISummarizer(llm_server.url, "m")
    clients: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        try:
            barrier.wait()
            clients.append(id(shared_client()))
            summarizer.summarize(make_request())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    wall = time.monotonic() - started

    assert errors == []
    assert len(llm_server.requests) == 8
    assert llm_server.max_in_flight >= 6
    assert wall < 2.0
    assert len(set(clients)) == 1


def test_shared_client_is_rebuilt_after_fork() -> None:
    parent = shared_client()
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's pool
        try:
            child = shared_client()
            os._exit(0 if child is not parent and shared_client() is child else 1)
        except BaseException:
            os._exit(2)
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("forked child did not finish")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shared_client() is parent


def test_configured_concurrency_sizes_the_pool(llm_server: ScriptedLLMServer) -> None:
    llm_server.latency = 0.3
    try:
        configure_shared_client(concurrency=2)
        summarizer = OpenAISummarizer(llm_server.url, "m")
        threads = [
            threading.Thread(target=summarizer.summarize, args=(make_request(),)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert len(llm_server.requests) == 4
        assert llm_server.max_in_flight == 2  # the other two queued for a pooled connection
        configure_shared_client(concurrency=2)  # same size: fine
        with pytest.raises(RuntimeError):
            configure_shared_client(concurrency=16)  # the pool is in use: too late
    finally:
        close_shared_client()
        configure_shared_client(concurrency=None)


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------


def test_parse_retry_after_forms() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "3"}) == 0.25
    date = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == 7.0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({"Retry-After": "-4"}) is None
    assert parse_retry_after({}) is None


def test_backoff_matches_spec_bounds() -> None:
    policy = RetryPolicy()
    first = [policy.backoff(1) for _ in range(200)]
    second = [policy.backoff(2) for _ in range(200)]
    assert all(0.5 <= w <= 0.6 for w in first)
    assert all(0.8 <= w <= 1.2 for w in second)
    assert all(policy.backoff(10) <= 5.0 for _ in range(50))
    assert policy.wait_before(1, retry_after=2.0) >= 2.0
    assert policy.wait_before(1, retry_after=999.0) == 30.0


def test_parse_openai_content_parts_and_usage() -> None:
    data = {
        "choices": [
            {
                "message": {
                    "content": [
                        {"type": "text", "text": "## Decisions"},
                        {"type": "image_url", "image_url": {}},
                        {"type": "text", "text": "- x"},
                    ]
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 40},
        },
    }
    text, usage = parse_chat_completion(data, max_tokens=10)
    assert text == "## Decisions\n- x"
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (60, 40, 9)
    with pytest.raises(EmptySummaryError):
        parse_chat_completion({"choices": [{"message": {"content": None}}]}, max_tokens=10)


def test_parse_anthropic_ignores_non_text_blocks() -> None:
    data = {
        "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b"},
        ],
        "stop_reason": "end_turn",
    }
    assert parse_message(data, max_tokens=10)[0] == "a\nb"
    with pytest.raises(OutputBudgetExhaustedError):
        parse_message(
            {"content": [{"type": "thinking"}], "stop_reason": "max_tokens"}, max_tokens=5
        )


def test_scrub_removes_secrets_and_prompt_runs() -> None:
    prompt = "the quick brown fox jumps over the lazy dog near the riverbank at dawn"
    text = f"error: key sk-abcdef123 rejected; input was '{prompt}'"
    cleaned = scrub(text, secrets=["sk-abcdef123"], prompt=prompt)
    assert "sk-abcdef123" not in cleaned and "lazy dog" not in cleaned
    assert cleaned.startswith("error: key [redacted] rejected")
