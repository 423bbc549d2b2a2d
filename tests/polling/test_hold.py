"""PollHold: which hold a poll asks for and which read timeout follows from it."""

from __future__ import annotations

import pytest

from tinker_sync._config import Timeout
from tinker_sync._polling.hold import (
    ADVERT_HEADER,
    FEW_POLLS,
    HOLD_HEADER,
    LEGACY_TIMEOUT,
    MARGIN_S,
    MIN_HOLD_S,
    PollHold,
)


def test_without_an_advert_polls_look_as_before() -> None:
    hold = PollHold(connect_timeout=2.0)
    plan = hold.plan(1)
    assert plan.hold_s is None and plan.headers == {}
    assert plan.timeout == LEGACY_TIMEOUT == Timeout(45.0, connect=5.0)


def test_an_advertised_server_gets_a_short_hold_and_a_read_timeout_just_past_it() -> None:
    hold = PollHold(connect_timeout=2.0)
    hold.learn({ADVERT_HEADER: "20"})
    plan = hold.plan(1)
    assert plan.hold_s == MIN_HOLD_S == 5.0
    assert plan.headers == {HOLD_HEADER: "5"}
    assert plan.timeout == Timeout(MIN_HOLD_S + MARGIN_S, connect=2.0)  # the user's connect


def test_a_server_max_below_the_client_hold_wins() -> None:
    hold = PollHold(connect_timeout=3.0)
    hold.learn({ADVERT_HEADER: "1.5"})
    plan = hold.plan(1)
    assert plan.hold_s == 1.5 and plan.headers == {HOLD_HEADER: "1.5"}
    assert plan.timeout == Timeout(1.5 + MARGIN_S, connect=3.0)


def test_many_polls_in_flight_keep_the_servers_long_hold() -> None:
    hold = PollHold()
    hold.learn({ADVERT_HEADER: "20"})
    assert hold.plan(FEW_POLLS).hold_s == MIN_HOLD_S
    many = hold.plan(FEW_POLLS + 1)
    assert many.hold_s is None and many.headers == {} and many.timeout == LEGACY_TIMEOUT


@pytest.mark.parametrize("raw", ["", "abc", "nan", "-1", "0", "1e9"])
def test_nonsense_adverts_are_ignored(raw: str) -> None:
    hold = PollHold()
    hold.learn({ADVERT_HEADER: raw})
    assert hold.server_max is None and hold.plan(1).hold_s is None


def test_polling_counts_polls_in_flight() -> None:
    hold = PollHold()
    hold.learn({ADVERT_HEADER: "20"})
    held = [hold.polling() for _ in range(FEW_POLLS + 1)]
    plans = [cm.__enter__() for cm in held]
    assert plans[FEW_POLLS - 1].hold_s == MIN_HOLD_S  # the 32nd in flight
    assert plans[FEW_POLLS].hold_s is None  # the 33rd
    held.pop().__exit__(None, None, None)
    assert hold.plan().hold_s == MIN_HOLD_S
    for cm in held:
        cm.__exit__(None, None, None)
    with hold.polling() as plan:
        assert plan.hold_s == MIN_HOLD_S
