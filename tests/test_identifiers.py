"""Opaque identifier extraction and the presence check of the audit (spec §6.3, TV21)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.identifiers import (
    MAX_EXTRACTED_IDENTIFIERS,
    extract_identifiers,
    identifier_present,
    is_pure_hex,
    missing_identifiers,
)


def test_tv21_hex_commit_is_uppercased_and_found_case_insensitively() -> None:
    ids = extract_identifiers("commit deadbeef01")
    assert ids == ["DEADBEEF01"]
    summary = "## Exact identifiers\n- commit deadbeef01 was reverted"
    assert identifier_present("DEADBEEF01", summary)
    assert missing_identifiers(ids, summary) == []


def test_uuid_keeps_its_case_and_dashes() -> None:
    text = "job 550e8400-E29B-41d4-a716-446655440000 failed"
    assert extract_identifiers(text) == ["550e8400-E29B-41d4-a716-446655440000"]


def test_sha_hashes() -> None:
    sha1 = "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3"
    sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    ids = extract_identifiers(f"sha1 {sha1}, sha256: {sha256}.")
    assert ids == [sha1.upper(), sha256.upper()]


def test_short_git_sha_of_eight() -> None:
    assert extract_identifiers("fixed in 1a2b3c4d") == ["1A2B3C4D"]
    # Seven hex characters is below the threshold.
    assert extract_identifiers("fixed in 1a2b3c4") == []


def test_mixed_token_with_hex_or_digit_run() -> None:
    assert extract_identifiers("request req_01HZX9cafebabe42 done") == ["req_01HZX9cafebabe42"]
    assert extract_identifiers("order ORD-20240117 shipped") == ["ORD-20240117"]
    assert extract_identifiers("ticket 123456 and 12345") == ["123456"]


def test_urls_strip_trailing_punctuation() -> None:
    text = "See (https://example.com/a/b?x=1&y=2), then <http://h.io:8080/p>."
    assert extract_identifiers(text) == ["https://example.com/a/b?x=1&y=2", "http://h.io:8080/p"]


def test_host_and_port() -> None:
    text = "connect to db.internal:5432 or 10.0.0.7:6379; not example.com alone"
    assert extract_identifiers(text) == ["db.internal:5432", "10.0.0.7:6379"]


def test_posix_paths_need_two_segments_and_a_token_boundary() -> None:
    text = "edit /etc/nginx/nginx.conf and `/srv/app`, not /tmp or and/or or 1/2/3."
    assert extract_identifiers(text) == ["/etc/nginx/nginx.conf", "/srv/app"]


def test_windows_paths() -> None:
    assert extract_identifiers(r"open C:\Users\bob\notes.txt now") == [r"C:\Users\bob\notes.txt"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pi is 3.14.", ["3.14"]),
        ("lr 1e-5 or 3E+8", ["1e-5", "3E+8"]),
        ("took 2.5ms, used 3.5GB, 99.9% done", ["2.5ms", "3.5GB", "99.9%"]),
        ("python 3.11.4 on 192.168.1.20", ["3.11.4", "192.168.1.20"]),
        ("just 2.5 and 42 and 7", []),  # shorter than four characters, or plain integers
    ],
)
def test_numbers(text: str, expected: list[str]) -> None:
    assert extract_identifiers(text) == expected


def test_ordinary_prose_yields_nothing() -> None:
    text = "Please refactor the acceptance tests; the deployment failed on Friday."
    assert extract_identifiers(text) == []


def test_dedupe_keeps_first_occurrence_order() -> None:
    text = "abcdef0123 then https://a.io/x then ABCDEF0123 then https://a.io/x"
    assert extract_identifiers(text) == ["ABCDEF0123", "https://a.io/x"]


def test_limit() -> None:
    text = " ".join(f"{i:08x}" for i in range(0xA0000000, 0xA0000000 + 20))
    ids = extract_identifiers(text)
    assert len(ids) == MAX_EXTRACTED_IDENTIFIERS == 12
    assert ids[0] == "A0000000"
    assert extract_identifiers(text, limit=3) == ["A0000000", "A0000001", "A0000002"]
    assert extract_identifiers(text, limit=0) == []


def test_presence_is_exact_for_non_hex() -> None:
    assert identifier_present("/etc/hosts", "edited /etc/hosts")
    assert not identifier_present("/etc/hosts", "edited /ETC/HOSTS")
    assert not identifier_present("db.internal:5432", "db.internal:5433")
    assert identifier_present("550e8400-E29B", "550e8400-E29B")
    assert not identifier_present("550e8400-E29B", "550e8400-e29b")  # not pure hex: exact
    assert identifier_present("", "anything")


def test_missing_identifiers_keeps_order() -> None:
    ids = ["DEADBEEF01", "https://a.io/x", "/srv/app"]
    assert missing_identifiers(ids, "saw deadbeef01 in /srv/app") == ["https://a.io/x"]


def test_is_pure_hex() -> None:
    assert is_pure_hex("deadbeef")
    assert is_pure_hex("12345678")
    assert not is_pure_hex("deadbee")
    assert not is_pure_hex("deadbeeg")


@given(st.text(max_size=400))
def test_extraction_is_total_and_bounded(text: str) -> None:
    ids = extract_identifiers(text)
    assert len(ids) <= MAX_EXTRACTED_IDENTIFIERS
    assert len(set(ids)) == len(ids)
    assert all(len(i) >= 4 for i in ids)
    # Every extracted value can be found again in the text it came from.
    assert missing_identifiers(ids, text) == []
    assert ids == extract_identifiers(text)
