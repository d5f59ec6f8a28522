"""The pure state of resumable conversations: the journal's numbering and bounds, the
token registry, the failed-resume buckets (every clock passed in)."""

from __future__ import annotations

from realtime.session.resume import (
    FailedResumes,
    Journal,
    Registry,
    event_size,
    new_token,
    token_digest,
)


def journal(max_bytes: int = 1000, max_seconds: float = 60.0) -> Journal:
    return Journal(max_bytes, max_seconds)


def test_events_are_numbered_from_one_and_replayed_after_last_seq() -> None:
    j = journal()
    assert [j.append(f"e{i}", 0.0) for i in range(1, 6)] == [1, 2, 3, 4, 5]
    assert j.holds_after(0, 0.0) and j.between(0, 5) == ["e1", "e2", "e3", "e4", "e5"]
    assert j.between(3, 5) == ["e4", "e5"]
    assert j.holds_after(5, 0.0) and j.between(5, 5) == []
    assert not j.holds_after(6, 0.0)  # past what was sent


def test_an_ack_drops_what_the_client_has() -> None:
    j = journal()
    for _ in range(5):
        j.append("x" * 10, 0.0)
    assert j.size == 50
    assert j.ack(3) and j.floor == 3 and j.size == 20
    assert j.between(3, 5) == ["x" * 10] * 2
    assert not j.holds_after(2, 0.0)  # acknowledged: gone
    assert j.ack(1) and j.floor == 3  # an older ack changes nothing
    assert not j.ack(6) and not j.ack(-1)  # above what was sent, negative
    assert j.floor == 3


def test_the_byte_bound_drops_the_oldest_and_a_resume_needing_them_must_resync() -> None:
    j = journal(max_bytes=25)
    for _ in range(5):
        j.append("y" * 10, 0.0)
    assert j.size == 20 and j.floor == 3
    assert not j.holds_after(2, 0.0) and j.holds_after(3, 0.0)


def test_one_event_larger_than_the_bound_is_not_kept() -> None:
    j = journal(max_bytes=5)
    assert j.append("z" * 6, 0.0) == 1
    assert j.size == 0 and j.floor == 1
    assert j.holds_after(1, 0.0) and not j.holds_after(0, 0.0)


def test_the_age_bound_drops_old_events_at_the_next_look() -> None:
    j = journal(max_seconds=60.0)
    j.append("a", 0.0)
    j.append("b", 30.0)
    assert j.holds_after(0, 59.0)
    assert not j.holds_after(0, 60.5) and j.holds_after(1, 60.5)
    assert not j.holds_after(1, 90.5) and j.holds_after(2, 90.5)


def test_sizes_are_utf8_bytes() -> None:
    assert event_size("abc") == 3
    assert event_size("é") == 2


def test_the_registry_answers_the_same_tenant_at_the_same_endpoint_only() -> None:
    registry: Registry[str] = Registry()
    token = new_token()
    assert len(token) >= 43  # 256 bits, URL-safe base64
    digest = registry.add(token, "session", "acme", "/v1/realtime")
    assert digest == token_digest(token) and token.encode() not in digest
    assert registry.find(token, "acme", "/v1/realtime") == "session"
    assert registry.find(token, "other", "/v1/realtime") is None
    assert registry.find(token, None, "/v1/realtime") is None
    assert registry.find(token, "acme", "/openai/v1/realtime") is None
    assert registry.find(new_token(), "acme", "/v1/realtime") is None
    for junk in ("", 42, None, "x" * 1000, ["token"]):
        assert registry.find(junk, "acme", "/v1/realtime") is None
    registry.remove(digest)
    assert registry.find(token, "acme", "/v1/realtime") is None and len(registry) == 0
    registry.remove(digest)  # twice is fine


def test_an_ended_sessions_tail_expires_with_its_grace() -> None:
    registry: Registry[str] = Registry()
    tail, running = new_token(), new_token()
    kept = registry.add(tail, "ended", "acme", "/v1/realtime", now=0.0)
    registry.add(running, "running", "acme", "/v1/realtime", now=0.0)
    registry.keep_until(kept, 30.0)  # it ended at 0 s, with a 30 s grace
    assert registry.find(tail, "acme", "/v1/realtime", now=29.9) == "ended"
    assert registry.holders(29.9) == ["ended", "running"]
    assert registry.find(tail, "acme", "/v1/realtime", now=30.0) is None
    assert registry.holders(30.0) == ["running"] and len(registry) == 1
    # A running session's entry does not expire; an expired one is forgotten on add too.
    registry.keep_until(registry.add(new_token(), "x", None, "/v1/realtime", now=31.0), 40.0)
    registry.add(new_token(), "y", None, "/v1/realtime", now=40.0)
    assert registry.holders() == ["running", "y"]
    assert registry.find(running, "acme", "/v1/realtime", now=1e9) == "running"
    registry.keep_until(kept, 99.0)  # gone already: nothing to keep


def test_failed_resumes_are_bounded_per_address_and_refill() -> None:
    failed = FailedResumes(burst=3, refill_seconds=10.0)
    for _ in range(3):
        assert failed.allowed("10.0.0.1", 0.0)
        failed.failed("10.0.0.1", 0.0)
    assert not failed.allowed("10.0.0.1", 0.0)
    assert failed.allowed("10.0.0.2", 0.0)  # another address is not held back
    assert not failed.allowed("10.0.0.1", 9.9)
    assert failed.allowed("10.0.0.1", 10.0)
    failed.failed("10.0.0.1", 10.0)
    assert not failed.allowed("10.0.0.1", 10.0)
    assert failed.allowed("10.0.0.1", 1000.0)


def test_the_failure_table_stays_bounded_under_many_addresses() -> None:
    failed = FailedResumes(burst=2, refill_seconds=10.0, max_addresses=100)
    for i in range(1000):
        failed.failed(f"10.0.{i // 256}.{i % 256}", float(i) / 1000)
    assert len(failed._buckets) <= 100
