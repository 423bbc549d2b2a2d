"""The ``every=K`` selection of fault rules (added for the soak test's deterministic rates)."""

from __future__ import annotations

import pytest
import requests

from tinker_sync.local import LocalServer
from tinker_sync.local._faults import Fault, FaultPlan, parse_fault


def hits_at(plan: FaultPlan, n: int, endpoint: str = "asample") -> list[int]:
    """1-based indices of the first ``n`` matching requests that a rule acted on."""
    out = []
    for i in range(1, n + 1):
        decision = plan.evaluate("POST", f"/api/v1/{endpoint}", endpoint)
        if decision is not None and decision.action is not None:
            out.append(i)
    return out


def test_compact_form_and_dict_round_trip_keep_every() -> None:
    fault = parse_fault("asample 503 x* every=20")
    assert fault.every == 20 and fault.times is None and fault.status == 503
    assert Fault.from_dict(fault.to_dict()) == fault
    assert "every" not in parse_fault("asample 503").to_dict()  # default stays implicit


def test_every_applies_to_each_kth_match_after_the_first_n() -> None:
    assert hits_at(FaultPlan(["asample 503 x* every=20"]), 100) == [20, 40, 60, 80, 100]
    assert hits_at(FaultPlan(["asample 503 x* every=4 after=3"]), 16) == [7, 11, 15]
    assert hits_at(FaultPlan(["asample 503 x2 every=3"]), 30) == [3, 6]  # times counts hits
    assert hits_at(FaultPlan(["asample 503 x*"]), 3) == [1, 2, 3]  # every=1 is the default


def test_a_skipped_match_falls_through_to_later_rules() -> None:
    plan = FaultPlan(["asample 503 x* every=2", "asample 429 x*"])
    statuses = []
    for _ in range(4):
        decision = plan.evaluate("POST", "/api/v1/asample", "asample")
        assert decision is not None and decision.action is not None
        statuses.append(decision.action.status)
    assert statuses == [429, 503, 429, 503]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_invalid_every_is_rejected_naming_the_key(bad: object) -> None:
    with pytest.raises(ValueError, match="'every'"):
        Fault(endpoint="asample", status=503, every=bad)  # type: ignore[arg-type]


def test_every_on_a_live_server() -> None:
    with LocalServer(faults=["healthz 503 x* every=4"]) as server:
        url = f"{server.url}/api/v1/healthz"
        headers = {"X-API-Key": server.api_key or ""}
        with requests.Session() as http:
            statuses = [http.get(url, headers=headers, timeout=10).status_code for _ in range(12)]
    assert statuses == [200, 200, 200, 503] * 3
