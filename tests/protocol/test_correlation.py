"""Request correlation: id remapping across origins, progress tokens, deadlines on an injected clock, drains."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from bastion.protocol.correlation import Correlator, DuplicateRequestId, Pending

from tests.properties import PROPERTY


@dataclass
class ManualClock:
    """Time as the caller would pass it in; advanced by hand, never read from the system."""

    now: float = 1000.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


# ------------------------------------------------------------------------------------------- remapping
def test_same_id_from_different_origins_gets_distinct_upstream_ids() -> None:
    correlator = Correlator()
    a = correlator.register("client-a", 1, "tools/call")
    b = correlator.register("client-b", 1, "tools/call")
    assert a.upstream_id != b.upstream_id
    assert correlator.find_by_origin("client-a", 1) is a
    assert correlator.find_by_origin("client-b", 1) is b
    assert correlator.resolve(b.upstream_id) is b
    assert correlator.resolve(a.upstream_id) is a
    assert len(correlator) == 0


def test_string_and_integer_ids_are_different_requests() -> None:
    correlator = Correlator()
    number = correlator.register("c", 1, "ping")
    text = correlator.register("c", "1", "ping")
    assert number.upstream_id != text.upstream_id
    assert correlator.find_by_origin("c", 1) is number
    assert correlator.find_by_origin("c", "1") is text


def test_upstream_ids_are_fresh_integers_starting_at_one() -> None:
    correlator = Correlator()
    ids = [correlator.register("c", f"r{i}", "ping").upstream_id for i in range(5)]
    assert ids == [1, 2, 3, 4, 5]


def test_pending_keeps_what_the_origin_sent() -> None:
    marker = object()
    pending = Correlator().register(("conn", 7), "abc", "resources/read", deadline=5.0, progress_token="tok", context=marker)
    assert pending == Pending(pending.upstream_id, ("conn", 7), "abc", "resources/read", 5.0, "tok", marker)
    assert pending.context is marker


def test_duplicate_in_flight_id_from_one_origin_is_refused() -> None:
    correlator = Correlator()
    first = correlator.register("c", 3, "tools/call")
    with pytest.raises(DuplicateRequestId, match="3"):
        correlator.register("c", 3, "tools/list")
    assert len(correlator) == 1
    assert correlator.find_by_origin("c", 3) is first


def test_a_finished_id_may_be_reused_and_gets_a_new_upstream_id() -> None:
    correlator = Correlator()
    first = correlator.register("c", 3, "tools/call")
    correlator.resolve(first.upstream_id)
    second = correlator.register("c", 3, "tools/call")
    assert second.upstream_id != first.upstream_id
    assert correlator.resolve(first.upstream_id) is None, "a late answer to the old request must not complete the new one"
    assert correlator.find_by_origin("c", 3) is second


@pytest.mark.parametrize("wrong", [True, False, 1.0, "1", None, [1], {"id": 1}])
def test_resolve_ignores_ids_that_were_never_handed_out(wrong: object) -> None:
    correlator = Correlator()
    correlator.register("c", 1, "ping")  # upstream id 1, which True and 1.0 compare equal to
    assert correlator.resolve(wrong) is None
    assert len(correlator) == 1


def test_resolve_takes_a_request_once() -> None:
    correlator = Correlator()
    pending = correlator.register("c", 1, "ping")
    assert correlator.resolve(pending.upstream_id) is pending
    assert correlator.resolve(pending.upstream_id) is None
    assert correlator.find_by_origin("c", 1) is None


# -------------------------------------------------------------------------------------- progress tokens
def test_progress_token_follows_the_remapping() -> None:
    correlator = Correlator()
    a = correlator.register("a", 1, "tools/call", progress_token="shared-token")
    b = correlator.register("b", 1, "tools/call", progress_token="shared-token")
    assert a.upstream_progress_token == a.upstream_id
    assert b.upstream_progress_token == b.upstream_id
    assert a.upstream_progress_token != b.upstream_progress_token
    assert correlator.find_by_progress_token(a.upstream_progress_token) is a
    assert correlator.find_by_progress_token(b.upstream_progress_token) is b
    assert a.origin_progress_token == b.origin_progress_token == "shared-token"


@pytest.mark.parametrize("token", [0, "0", "tok", -1])
def test_any_origin_token_is_kept_for_the_way_back(token: object) -> None:
    pending = Correlator().register("a", 1, "tools/call", progress_token=token)
    assert pending.origin_progress_token == token
    assert pending.upstream_progress_token == pending.upstream_id


def test_no_progress_token_means_no_upstream_token() -> None:
    correlator = Correlator()
    pending = correlator.register("a", 1, "tools/call")
    assert pending.upstream_progress_token is None
    assert correlator.find_by_progress_token(pending.upstream_id) is None


def test_progress_lookup_uses_upstream_tokens_only() -> None:
    correlator = Correlator()
    pending = correlator.register("a", 1, "tools/call", progress_token="tok")
    assert correlator.find_by_progress_token("tok") is None
    assert correlator.find_by_progress_token(str(pending.upstream_id)) is None
    assert correlator.find_by_progress_token(True) is None
    assert correlator.find_by_progress_token(float(pending.upstream_id)) is None
    assert correlator.find_by_progress_token(pending.upstream_id + 1) is None


def test_progress_after_the_answer_finds_nothing() -> None:
    correlator = Correlator()
    pending = correlator.register("a", 1, "tools/call", progress_token="tok")
    correlator.resolve(pending.upstream_id)
    assert correlator.find_by_progress_token(pending.upstream_progress_token) is None


# -------------------------------------------------------------------------------------------- deadlines
def test_deadlines_on_an_injected_clock() -> None:
    clock = ManualClock()
    correlator = Correlator()
    soon = correlator.register("a", 1, "tools/call", deadline=clock.now + 1)
    later = correlator.register("a", 2, "tools/call", deadline=clock.now + 5)
    never = correlator.register("a", 3, "tools/call")
    assert correlator.next_deadline() == soon.deadline
    assert correlator.expired(clock.now) == []
    assert correlator.expired(clock.advance(0.999)) == []
    assert correlator.expired(clock.advance(0.001)) == [soon], "a deadline equal to now has passed"
    assert correlator.find_by_origin("a", 1) is None
    assert correlator.next_deadline() == later.deadline
    assert correlator.expired(clock.advance(100)) == [later]
    assert correlator.next_deadline() is None
    assert correlator.expired(clock.advance(1e9)) == []
    assert correlator.find_by_origin("a", 3) is never
    assert len(correlator) == 1


def test_expired_takes_every_late_request_at_once() -> None:
    correlator = Correlator()
    late = [correlator.register("a", i, "ping", deadline=float(i)) for i in range(5)]
    on_time = correlator.register("a", 99, "ping", deadline=10.0)
    assert sorted(p.upstream_id for p in correlator.expired(4.0)) == [p.upstream_id for p in late]
    assert len(correlator) == 1
    assert correlator.next_deadline() == on_time.deadline


def test_next_deadline_of_an_empty_correlator_is_none() -> None:
    assert Correlator().next_deadline() is None
    assert Correlator().expired(1e18) == []


def test_resolved_requests_no_longer_count_towards_the_next_deadline() -> None:
    correlator = Correlator()
    first = correlator.register("a", 1, "ping", deadline=1.0)
    correlator.register("a", 2, "ping", deadline=2.0)
    correlator.resolve(first.upstream_id)
    assert correlator.next_deadline() == 2.0


# ------------------------------------------------------------------------------------------------ drain
def test_drain_one_origin_leaves_the_others() -> None:
    correlator = Correlator()
    a1 = correlator.register("a", 1, "ping")
    b1 = correlator.register("b", 1, "ping")
    a2 = correlator.register("a", 2, "ping")
    assert correlator.drain("a") == [a1, a2]
    assert len(correlator) == 1
    assert correlator.find_by_origin("b", 1) is b1
    assert correlator.find_by_origin("a", 1) is None
    assert correlator.resolve(a1.upstream_id) is None
    assert correlator.drain("a") == []


def test_drain_everything_when_the_far_side_is_gone() -> None:
    correlator = Correlator()
    taken = [correlator.register(origin, 1, "ping") for origin in ("a", "b", "c")]
    assert correlator.drain() == taken
    assert len(correlator) == 0
    assert correlator.next_deadline() is None


def test_drain_of_an_unknown_origin_takes_nothing() -> None:
    correlator = Correlator()
    correlator.register("a", 1, "ping")
    assert correlator.drain("nobody") == []
    assert len(correlator) == 1


# --------------------------------------------------------------------------------- stateful property test
ORIGINS = st.sampled_from(["a", "b", ("conn", 1), 7])
ORIGIN_IDS = st.integers(min_value=-3, max_value=3) | st.sampled_from(["x", "y", "1"])


class CorrelatorModel(RuleBasedStateMachine):
    """Random register/resolve/expire/drain sequences against a dictionary model."""

    outstanding = Bundle("outstanding")

    def __init__(self) -> None:
        super().__init__()
        self.correlator = Correlator()
        self.model: dict[int, tuple[object, object, float | None, object]] = {}
        self.ever_issued: set[int] = set()

    @rule(target=outstanding, origin=ORIGINS, origin_id=ORIGIN_IDS,
          deadline=st.none() | st.integers(0, 20).map(float), token=st.none() | st.sampled_from(["t", 0, 5]))
    def register(self, origin, origin_id, deadline, token):
        in_flight = any(o == origin and i == origin_id and type(i) is type(origin_id) for o, i, _, _ in self.model.values())
        if in_flight:
            with pytest.raises(DuplicateRequestId):
                self.correlator.register(origin, origin_id, "m", deadline=deadline, progress_token=token)
            return -1
        pending = self.correlator.register(origin, origin_id, "m", deadline=deadline, progress_token=token)
        assert pending.upstream_id not in self.ever_issued, "an upstream id was handed out twice"
        self.ever_issued.add(pending.upstream_id)
        self.model[pending.upstream_id] = (origin, origin_id, deadline, token)
        return pending.upstream_id

    @rule(upstream_id=consumes(outstanding))
    def resolve(self, upstream_id):
        pending = self.correlator.resolve(upstream_id)
        expected = self.model.pop(upstream_id, None)
        if expected is None:
            assert pending is None
        else:
            assert pending is not None and (pending.origin, pending.origin_id) == expected[:2]

    @rule(upstream_id=outstanding)
    def progress(self, upstream_id):
        found = self.correlator.find_by_progress_token(upstream_id)
        entry = self.model.get(upstream_id)
        if entry is None or entry[3] is None:
            assert found is None
        else:
            assert found is not None and found.upstream_id == upstream_id and found.origin_progress_token == entry[3]

    @rule(now=st.integers(0, 25).map(float))
    def expire(self, now):
        taken = {p.upstream_id for p in self.correlator.expired(now)}
        expected = {u for u, (_, _, d, _) in self.model.items() if d is not None and d <= now}
        assert taken == expected
        for upstream_id in expected:
            del self.model[upstream_id]

    @rule(origin=ORIGINS)
    def drain_origin(self, origin):
        taken = {p.upstream_id for p in self.correlator.drain(origin)}
        expected = {u for u, (o, _, _, _) in self.model.items() if o == origin}
        assert taken == expected
        for upstream_id in expected:
            del self.model[upstream_id]

    @invariant()
    def agrees_with_the_model(self):
        assert len(self.correlator) == len(self.model)
        deadlines = [d for _, _, d, _ in self.model.values() if d is not None]
        assert self.correlator.next_deadline() == (min(deadlines) if deadlines else None)
        for upstream_id, (origin, origin_id, _, _) in self.model.items():
            found = self.correlator.find_by_origin(origin, origin_id)
            assert found is not None and found.upstream_id == upstream_id


TestCorrelatorModel = CorrelatorModel.TestCase
TestCorrelatorModel.settings = settings(PROPERTY, max_examples=150, stateful_step_count=40)
