"""Latest-ask overlap rule (spec §6.4) and grounding of pending asks in real user messages."""

from __future__ import annotations

import json

import pytest

from pipeline.asks import (
    STOP_WORDS,
    ask_grounded,
    ask_reflected,
    ask_tokens,
    is_placeholder_line,
    pending_ask_lines,
    raw_tokens,
    required_matches,
)

# --- tokenizer --------------------------------------------------------------------------------


def test_tokens_drop_stop_words_and_single_letters_keep_order() -> None:
    ask = "Please fix the failing login tests in auth.py, and a b c thanks!"
    assert ask_tokens(ask) == ["fix", "failing", "login", "tests", "auth", "py"]


def test_tokens_are_unique_and_capped_at_twelve() -> None:
    words = [f"word{i}" for i in range(20)]
    ask = " ".join(words + words)
    assert ask_tokens(ask) == words[:12]


def test_only_stop_words_are_kept_when_nothing_else_remains() -> None:
    assert ask_tokens("do it now") == ["do", "it", "now"]
    assert ask_tokens("!!! ??? 🙂") == []


def test_nfkc_and_casefold() -> None:
    # Full-width letters, a ligature and the German sharp s all normalize.
    assert ask_tokens("ＤＥＰＬＯＹ the ﬁle STRAẞE") == ["deploy", "file", "strasse"]
    assert raw_tokens("Don't_stop") == ["don", "t", "stop"]


def test_stop_word_list_is_ours_and_sane() -> None:
    assert {"the", "please", "and", "you", "should"} <= STOP_WORDS
    assert not {"database", "deploy", "test", "fix"} & STOP_WORDS


def test_required_matches_threshold() -> None:
    assert required_matches(0) == 1
    assert required_matches(2) == 1
    assert required_matches(3) == 2
    assert required_matches(12) == 2


# --- ask_reflected ----------------------------------------------------------------------------

SUMMARY = """## Decisions
- Switched the payment service to the v2 client.

## Pending user asks
- Migrate the billing cron job to the new scheduler.
"""


def test_reflected_when_two_keywords_match() -> None:
    assert ask_reflected("Can you migrate the billing cron job?", SUMMARY)


def test_not_reflected_with_one_of_three_keywords() -> None:
    # keywords: rotate, billing, certificates -> needs 2, only "billing" is there.
    assert ask_tokens("rotate the billing certificates") == ["rotate", "billing", "certificates"]
    assert not ask_reflected("rotate the billing certificates", SUMMARY)


def test_one_match_is_enough_for_short_asks() -> None:
    assert ask_tokens("migrate it please") == ["migrate"]
    assert ask_reflected("migrate it please", SUMMARY)
    assert ask_reflected("scheduler and cron", SUMMARY)  # two keywords, one needed
    assert not ask_reflected("rename variables", SUMMARY)


def test_summary_side_uses_raw_tokens_including_stop_words() -> None:
    # Ask made only of stop words: checked on those words against the summary's raw tokens.
    assert ask_reflected("do it now", "We will do it now.")
    assert not ask_reflected("do it now", "Nothing relevant here.")


def test_empty_ask_passes() -> None:
    assert ask_reflected("", "anything")
    assert ask_reflected("?!", "")


def test_reflection_ignores_case_and_width() -> None:
    assert ask_reflected("MIGRATE BILLING", SUMMARY)
    assert ask_reflected("ｍｉｇｒａｔｅ ｂｉｌｌｉｎｇ", SUMMARY)


# --- ask_grounded -----------------------------------------------------------------------------

USERS = [
    "Hi! Can you look at why the login page is slow?",
    "Also please add a retry around the S3 upload in storage/s3.py.",
]


def test_grounded_by_keywords_in_one_user_message() -> None:
    assert ask_grounded("- Investigate why the login page is slow", USERS)
    assert ask_grounded("- Add retry logic to the S3 upload", USERS)


def test_invented_ask_is_not_grounded() -> None:
    assert not ask_grounded("- Deploy the release to production", USERS)
    assert not ask_grounded("- Rewrite the billing module in Rust", USERS)


def test_keywords_spread_over_messages_do_not_ground() -> None:
    # "login" is only in message 1, "upload" only in message 2: stitched, not asked.
    assert not ask_grounded("- Upload the login assets to production", USERS)


def test_meta_words_do_not_ground_an_invented_ask() -> None:
    users = ["The user table has a duplicate row, can you check it?"]
    assert not ask_grounded("- User asked to delete the production database", users)
    assert ask_grounded("- User asked to check the duplicate row in the user table", users)


def test_grounded_by_quotation() -> None:
    users = ["plz make teh dashbord load faster, its painful"]
    assert ask_grounded('- "make teh dashbord load faster"', users)
    assert ask_grounded("- User said: “make teh dashbord load faster”", users)
    # A quote that is not in any user message grounds nothing.
    assert not ask_grounded('- "rebuild the search index overnight"', users)


def test_line_containing_a_whole_short_user_message_is_grounded() -> None:
    assert ask_grounded("- Pending: bump ruff to 0.9 (asked twice)", ["bump ruff to 0.9"])


def test_latest_ask_context_line_is_judged_on_its_decoded_text() -> None:
    ask = "Add a retry around the S3 upload"
    line = f"Latest user request context: {json.dumps(ask)}"
    assert ask_grounded(line, USERS)
    invented = f"Latest user request context: {json.dumps('Delete all backups')}"
    assert not ask_grounded(invented, USERS)


@pytest.mark.parametrize(
    "line",
    [
        "None.",
        "(none)",
        "- None",
        "No pending asks",
        "No pending user asks.",
        "None captured.",
        "N/A",
        "Nothing pending.",
        "- (None)",
        "",
    ],
)
def test_placeholders_are_not_asks(line: str) -> None:
    assert is_placeholder_line(line)
    assert ask_grounded(line, [])


@pytest.mark.parametrize("line", ["- fix the bug", "None of the tests pass", "No force pushes"])
def test_real_lines_are_not_placeholders(line: str) -> None:
    assert not is_placeholder_line(line)


def test_pending_ask_lines_reads_only_that_section() -> None:
    summary = (
        "## Open TODOs\n- write docs\n\n## Pending user asks\n"
        'Latest user request context: "fix it"\n- second ask\nNone.\n\n'
        "## Exact identifiers\n- DEADBEEF\n"
    )
    assert pending_ask_lines(summary) == ['Latest user request context: "fix it"', "- second ask"]
    assert pending_ask_lines("## Decisions\n- x\n") == []
