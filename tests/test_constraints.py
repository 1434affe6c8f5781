"""The constraint register: extraction from user turns, summary round trip, merge and bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.constraints import (
    CONSTRAINTS_HEADING,
    MAX_CONSTRAINT_CHARS,
    constraint_key,
    constraints_from_summary,
    extract_constraints,
    is_standing_rule,
    merge_register,
)

RULES = [
    "don't touch the database",
    "Never push to main.",
    "From now on, use pnpm",
    "Always run the tests before committing",
    "You must not delete files in /etc",
    "Only use the staging bucket",
    "Rule: no force pushes",
    "Make sure to keep the API backwards compatible",
    "please do not email customers",
    "Please don't rename public functions.",
    "Do not modify the migrations folder.",
    "We never deploy on Fridays.",
    "Avoid adding new dependencies.",
    "Under no circumstances should you run the reset script.",
    "Stop adding comments to every line.",
    "Remember to update the CHANGELOG.",
    "Commits should never go directly to main.",
    "The API must stay backwards compatible.",
    "Use only the staging bucket.",
    "Important: never log secrets.",
    "When deploying, always run migrations first.",
    "If the tests fail, never merge.",
    "Run the linter and never skip the type check.",
    "Could you please never use tabs again",
    "Going forward, write commit messages in English.",
    "Use pnpm going forward.",
    "Force pushing is not allowed.",
    "Ensure every endpoint checks auth.",
    "You should never commit .env files.",
    "**Never** push to main",
    "Don’t touch prod.",  # typographic apostrophe
    "dont use global state",
    "Everyone must use 2FA.",
    "As a rule, prefer composition over inheritance.",
    "New rule: every PR needs a test.",
    "Rule of thumb: keep functions short",
    "It's a rule that we never merge on red.",
    "I'd like you to always answer in English.",
    "We should only deploy from CI.",
    "Tests must pass before merge.",
    "Use pnpm only.",
    "Deploy from CI only, never from a laptop.",
]

NOT_RULES = [
    "I never thought that would work?",
    "I never thought that would work.",
    "what does always mean here",
    "only 3 tests failed",
    "Only one test failed.",
    "Should we always squash commits?",
    "It always fails on CI.",
    "It must be the cache.",
    "Something must have changed.",
    "This must be a bug in the parser.",
    "Never mind, it works now.",
    "Don't worry about the flaky test.",
    "Don't you think that's odd",
    "I don't know why it broke.",
    "We only have 2 days left.",
    "The rules engine is broken.",
    "The rule is ignored by the linter.",
    "We rule out the network.",
    "Can you always reproduce it?",
    "Stop the server.",
    "I made sure the tests pass.",
    "I'll make sure to check.",
    "We tried and never got it working.",
    "To avoid conflicts I rebased.",
    "The project is moving forward nicely.",
    "It should never fail like that.",
    "There must be a better way.",
    "I was not allowed to access the bucket.",
    "You never listen.",
    "Always the same error.",
    "We must fix the login bug.",
    "From now on it will be faster.",
    "Always.",
    "Never again.",
    "Is it ok if I only run one test",
    "It happens on Linux only.",
]


@pytest.mark.parametrize("sentence", RULES)
def test_rule_phrasings_are_caught_verbatim(sentence: str) -> None:
    assert is_standing_rule(sentence)
    assert extract_constraints([sentence]) == [sentence]


@pytest.mark.parametrize("sentence", NOT_RULES)
def test_non_rules_are_left_alone(sentence: str) -> None:
    assert not is_standing_rule(sentence)
    assert extract_constraints([sentence]) == []


def test_brief_has_enough_cases() -> None:
    assert len(RULES) >= 15
    assert len(NOT_RULES) >= 8


def test_rule_sentence_is_isolated_from_its_message() -> None:
    message = (
        "Thanks for the fix. Never push to main. Also can you check the logs? "
        "I think the flag is `--only-dev` and the path is /never/always/x."
    )
    assert extract_constraints([message]) == ["Never push to main."]


def test_code_blocks_quotes_and_tool_output_are_ignored() -> None:
    message = "\n".join(
        [
            "Here is what I ran:",
            "```python",
            "# never do this",
            'assert x, "must not be None"',
            "```",
            "~~~",
            "always restart after deploy",
            "~~~",
            "> Always restart the worker after deploy",
            "    always_inline = True",
            "Traceback (most recent call last):",
            "ValueError: value must not be empty",
            "ERROR: you must not be root",
            "$ git push --force  # never",
            "2024-05-01 12:00:03 never retrying",
            "- don't touch the database",
        ]
    )
    assert extract_constraints([message]) == ["don't touch the database"]


def test_unclosed_fence_hides_the_rest() -> None:
    assert extract_constraints(["```\nnever do this\nalways that"]) == []


def test_keywords_in_inline_code_urls_and_paths_do_not_count() -> None:
    assert extract_constraints(["Set `never_retry` and see https://x.io/always/only"]) == []
    # ... but a real rule that mentions code keeps the code verbatim.
    assert extract_constraints(["Never run `git push --force`."]) == [
        "Never run `git push --force`."
    ]


def test_list_markers_are_stripped_and_whitespace_collapsed() -> None:
    message = (
        "Rules for this repo:\n- Never   push to main\n2. Always\trun the tests\n## Only use uv"
    )
    assert extract_constraints([message]) == [
        "Never push to main",
        "Always run the tests",
        "Only use uv",
    ]


def test_soft_wrapped_sentence_is_rejoined() -> None:
    assert extract_constraints(["Don't use\nthe legacy client for new code."]) == [
        "Don't use the legacy client for new code."
    ]


def test_abbreviations_do_not_split_sentences() -> None:
    assert extract_constraints(["Avoid globals, e.g. module-level caches. Ok thanks."]) == [
        "Avoid globals, e.g. module-level caches."
    ]


def test_long_rule_is_capped_at_a_word_boundary() -> None:
    sentence = "Never " + "really " * 80 + "push to main."
    [rule] = extract_constraints([sentence])
    assert len(rule) <= MAX_CONSTRAINT_CHARS
    assert rule.endswith("really…")
    assert rule.startswith("Never really")


def test_extraction_dedupes_across_messages_keeping_first_wording() -> None:
    texts = ["Never push to main.", "never push to main!", "NEVER  push to main", "Use pnpm only."]
    assert extract_constraints(texts) == ["Never push to main.", "Use pnpm only."]


def test_constraint_key_normalization() -> None:
    assert constraint_key("- Never  push to MAIN!!") == constraint_key("never push to main")
    assert constraint_key("Don’t touch prod.") == constraint_key("don't touch prod")
    assert constraint_key("Never push to main") != constraint_key("Never push to dev")


# --- summary round trip -----------------------------------------------------------------------


def render(rules: list[str]) -> str:
    body = "\n".join(f"- {rule}" for rule in rules) or "None."
    return (
        "## Decisions\n- Adopted pnpm.\n\n## Open TODOs\n- Ship it.\n\n"
        f"{CONSTRAINTS_HEADING}\n{body}\n\n## Pending user asks\n- Fix the build.\n\n"
        "## Exact identifiers\n- DEADBEEF01\n"
    )


def test_round_trip_through_a_summary_section() -> None:
    rules = extract_constraints(
        ["don't touch the database", "ok. Never push to main. From now on, use pnpm"]
    )
    assert rules == ["don't touch the database", "Never push to main.", "From now on, use pnpm"]
    assert constraints_from_summary(render(rules)) == rules


def test_summary_placeholders_and_section_end() -> None:
    assert constraints_from_summary(render([])) == []
    summary = f"{CONSTRAINTS_HEADING}\n- (none)\n- No constraints yet.\n## Pending user asks\n- a"
    assert constraints_from_summary(summary) == []
    assert constraints_from_summary("## Decisions\n- Never push to main\n") == []


def test_summary_section_variants() -> None:
    summary = (
        f"{CONSTRAINTS_HEADING}\n"
        "The user set these rules:\n"
        "* Never push to main.\n"
        "  Applies to release branches too.\n"
        "1. None of the files in /etc may be deleted.\n"
        "\n## Pending user asks\n"
    )
    assert constraints_from_summary(summary) == [
        "Never push to main. Applies to release branches too.",
        "None of the files in /etc may be deleted.",
    ]
    plain = f"{CONSTRAINTS_HEADING}\nAlways use UTC\nNone.\nNever guess ids\n\n## Pending user asks"
    assert constraints_from_summary(plain) == ["Always use UTC", "Never guess ids"]


# --- merge and bounds -------------------------------------------------------------------------


def test_merge_dedupes_and_keeps_oldest_first() -> None:
    previous = ["Never push to main.", "Use UTC timestamps."]
    new = ["never push to main", "Avoid globals."]
    assert merge_register(previous, new) == [
        "Never push to main.",
        "Use UTC timestamps.",
        "Avoid globals.",
    ]


def test_merge_drops_placeholders_and_blank_items() -> None:
    assert merge_register(["None.", "  ", "(none)"], ["Never push to main."]) == [
        "Never push to main."
    ]


def test_merge_over_limit_evicts_least_recently_mentioned() -> None:
    previous = [f"Rule {i}: keep thing {i}" for i in range(5)]
    # Rule 0 is restated by the user now, so it is the most recent mention.
    new = ["rule 0: keep thing 0", "Always sign commits."]
    merged = merge_register(previous, new, limit=3)
    assert merged == ["Rule 0: keep thing 0", "Rule 4: keep thing 4", "Always sign commits."]


def test_new_user_rules_outlive_carried_ones() -> None:
    previous = [f"Carried rule {i}" for i in range(10)]
    new = [f"Fresh rule {i}" for i in range(3)]
    assert merge_register(previous, new, limit=3) == new
    # When the new rules alone exceed the bound, the newest of them are kept.
    assert merge_register([], [f"Fresh rule {i}" for i in range(6)], limit=2) == [
        "Fresh rule 4",
        "Fresh rule 5",
    ]


def test_merge_respects_char_budget() -> None:
    previous = ["a" * 50, "b" * 50]
    new = ["c" * 50]
    assert merge_register(previous, new, max_chars=102) == ["b" * 50, "c" * 50]
    # An item that can never fit is dropped instead of evicting everything else.
    assert merge_register(["x" * 10], ["y" * 500], max_chars=100) == ["x" * 10]
    assert merge_register(["x"], ["y"], limit=0) == []


@given(
    st.lists(st.text(min_size=1, max_size=40), max_size=30),
    st.lists(st.text(min_size=1, max_size=40), max_size=30),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=1, max_value=400),
)
def test_merge_invariants(previous: list[str], new: list[str], limit: int, max_chars: int) -> None:
    merged = merge_register(previous, new, limit=limit, max_chars=max_chars)
    assert len(merged) <= limit
    assert sum(len(item) + 1 for item in merged) <= max_chars
    keys = [constraint_key(item) for item in merged]
    assert len(keys) == len(set(keys))
    # Verbatim up to whitespace collapsing, and in input order.
    sources = [" ".join(item.split()) for item in [*previous, *new]]
    positions = [sources.index(item) for item in merged]
    assert positions == sorted(positions)


@given(st.lists(st.text(max_size=200), max_size=5))
def test_extraction_never_raises_and_is_bounded(texts: list[str]) -> None:
    rules = extract_constraints(texts)
    assert all(0 < len(rule) <= MAX_CONSTRAINT_CHARS for rule in rules)
    assert rules == extract_constraints(texts)
