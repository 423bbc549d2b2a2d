"""Fault rules: parsing (compact strings, dicts), globs, plan evaluation, and every action over HTTP."""

from __future__ import annotations

import email.utils
import http.client
import json
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tinker_sync.local._faults import Fault, FaultPlan, compile_glob, endpoint_of, parse_fault
from tinker_sync.local._http import HttpServer
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._log import RequestLog

# -- compact strings ----------------------------------------------------------------------

PARSE_TABLE: list[tuple[str, dict[str, Any]]] = [
    ("asample 429 x2 retry_after=0.5", {"status": 429, "times": 2, "retry_after": 0.5}),
    ("asample 429 retry_after_date=3", {"status": 429, "retry_after_date": 3, "times": 1}),
    ("retrieve_future 503 x3", {"endpoint": "retrieve_future", "status": 503, "times": 3}),
    ("forward_backward drop-after", {"drop": "after", "name": "forward_backward drop-after"}),
    ("optim_step drop-before", {"drop": "before"}),
    (
        'retrieve_future paused_rate_limit x5 reason="limit hit"',
        {"queue_state": "paused_rate_limit", "times": 5, "reason": "limit hit"},
    ),
    ("retrieve_future paused_capacity", {"queue_state": "paused_capacity"}),
    (
        "retrieve_future fail:user match.request_type=Sample",
        {"fail": "user", "match": {"request_type": "Sample"}},
    ),
    (
        "retrieve_future expire match.request_type=ForwardBackward",
        {"expire": True, "match": {"request_type": "ForwardBackward"}},
    ),
    ("retrieve_future metadata", {"metadata_only": True}),
    ("asample 400 empty_body=true", {"status": 400, "empty_body": True}),
    ("create_session 500 x* should_retry=false", {"times": None, "should_retry": False}),
    ("* delay=0.05 x*", {"endpoint": "*", "delay": 0.05, "times": None, "status": None}),
    ("asample@post 429", {"method": "POST", "name": "asample@POST 429"}),
    ('asample 429 retry_after="120"', {"retry_after": "120"}),
    ("asample 429 retry_after=soon", {"retry_after": "soon"}),
    ("asample 429 retry_after_ms=250", {"retry_after_ms": 250}),
    (
        'asample 500 match.seq_id=3 match.model_id="7" match.header:x-a=b',
        {"match": {"seq_id": 3, "model_id": "7", "header:x-a": "b"}},
    ),
    ('asample 503 body={"error": [1, 2]}', {"body": {"error": [1, 2]}}),
    ("asample 503 body='{\"a\": 1}'", {"body": {"a": 1}}),
    ("asample 503 body='not json'", {"body": "not json"}),
    ("asample 503 headers.x-extra=1 name=mine", {"headers": {"x-extra": "1"}, "name": "mine"}),
    ("asample 429 x1 after=2", {"after": 2, "times": 1}),
    ("training_runs/*/checkpoints/** 404", {"endpoint": "training_runs/*/checkpoints/**"}),
    ("/api/v1/asample 502", {"endpoint": "/api/v1/asample"}),
    ("asample fail:server message='boom here'", {"fail": "server", "message": "boom here"}),
]


@pytest.mark.parametrize(("spec", "expected"), PARSE_TABLE)
def test_compact_parser(spec: str, expected: dict[str, Any]) -> None:
    fault = parse_fault(spec)
    for key, value in expected.items():
        assert getattr(fault, key) == value, key
    # the same rule survives the dict round trip (JSON files, the admin API) and pickling
    assert Fault.from_dict(json.loads(json.dumps(fault.to_dict()))) == fault
    assert pickle.loads(pickle.dumps(fault)) == fault


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "asample bogus",
        "asample 429 500",
        "asample 429 drop-before",
        "asample 429 unknown_key=1",
        "asample fail:sometimes",
        "asample paused_capacity message=x",
        "asample empty_body=true",
        "asample 99",
        "asample 429 xx",
        'asample 429 reason="unterminated',
        "asample 429 times=-1",
        "asample 429 x2 x3",
        "asample 429 delay=-1",
    ],
)
def test_compact_parser_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_fault(spec)


def test_dict_form_and_validation() -> None:
    fault = parse_fault({"endpoint": "asample", "status": 429, "times": "*", "retry_after": 1})
    assert fault.times is None and fault.status == 429 and fault.name == "asample 429"
    with pytest.raises(ValueError, match="unknown fault rule key"):
        parse_fault({"endpoint": "asample", "stauts": 429})
    with pytest.raises(ValueError):
        parse_fault({"endpoint": "asample", "status": True})
    with pytest.raises(TypeError):
        parse_fault(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("asample", "/api/v1/asample", True),
        ("asample", "/api/v1/asample2", False),
        ("*", "/anything/at/all", True),
        ("training_runs/*", "/api/v1/training_runs/r1", True),
        ("training_runs/*", "/api/v1/training_runs/r1/checkpoints", False),
        (
            "training_runs/*/checkpoints/**",
            "/api/v1/training_runs/r1/checkpoints/weights/ck 1",
            True,
        ),
        ("training_runs/*/checkpoints/**", "/api/v1/training_runs/r1/checkpoints", True),
        ("training_runs/*/checkpoints/**", "/api/v1/training_runs/a/b/checkpoints/x", False),
        ("**/publish", "/api/v1/training_runs/r/checkpoints/w/c/publish", True),
        ("**/publish", "/api/v1/publish", True),
        ("sampl?rs/*", "/api/v1/samplers/s:1", True),
        ("/api/v1/asample", "/api/v1/asample", True),
        ("/api/v1/*", "/api/v1/asample", True),
        ("/api/v1/*", "/api/v1/a/b", False),
        ("/_files/**", "/_files/tok/x.bin", True),
        ("retrieve_future", "/api/v1/retrieve_futures", False),
    ],
)
def test_globs(pattern: str, path: str, expected: bool) -> None:
    assert compile_glob(pattern)(path, endpoint_of(path)) is expected


# -- plan evaluation --------------------------------------------------------------------------


def evaluate(plan: FaultPlan, path: str = "/api/v1/asample", method: str = "POST", **fields: Any):  # type: ignore[no-untyped-def]
    return plan.evaluate(method, path, endpoint_of(path), lambda: fields)


def test_times_and_after_are_counted_per_rule() -> None:
    plan = FaultPlan(["asample 503 x2 after=1"])
    actions = [evaluate(plan) for _ in range(5)]
    assert [a.action.status if a and a.action else None for a in actions] == [
        None,
        503,
        503,
        None,
        None,
    ]
    [rule] = plan.rules
    assert (rule.seen, rule.hits, rule.remaining) == (3, 2, 0)
    plan.assert_exhausted()


def test_first_matching_rule_with_budget_wins_then_falls_through() -> None:
    plan = FaultPlan(["asample 429 x1", "asample 503 x1", "* 500 x*"])
    names = [evaluate(plan).name for _ in range(3)]  # type: ignore[union-attr]
    assert names == ["asample 429", "asample 503", "* 500"]


def test_rules_without_action_apply_and_continue() -> None:
    plan = FaultPlan(["* delay=0.25 x*", "asample headers.x-a=1 x*", "asample 429 retry_after=2"])
    decision = evaluate(plan)
    assert decision is not None
    assert decision.delay == 0.25
    assert decision.headers == {"x-a": "1"}
    assert decision.action is not None and decision.action.status == 429
    assert decision.names == ["* delay=0.25", "asample headers", "asample 429"]
    assert decision.name == "asample 429"
    second = evaluate(plan)
    assert second is not None and second.action is None and second.name == "* delay=0.25"


def test_method_and_match_filters() -> None:
    plan = FaultPlan(
        [
            "asample@GET 500 x*",
            "asample 501 x* match.seq_id=3",
            "asample 502 x* match.header:x-stainless-retry-count=1",
            "retrieve_future fail:user x* match.request_type=Sample",
        ]
    )
    assert evaluate(plan, seq_id=2) is None
    assert evaluate(plan, seq_id=3).action.status == 501  # type: ignore[union-attr]
    hit = evaluate(plan, **{"header:x-stainless-retry-count": "1"})
    assert hit.action.status == 502  # type: ignore[union-attr]
    assert evaluate(plan, method="GET").action.status == 500  # type: ignore[union-attr]
    poll = "/api/v1/retrieve_future"
    assert evaluate(plan, poll, request_type="ForwardBackward") is None
    assert evaluate(plan, poll, request_type="Sample").action.fail == "user"  # type: ignore[union-attr]


def test_match_fields_are_computed_lazily_and_once() -> None:
    calls = []

    def fields() -> dict[str, Any]:
        calls.append(1)
        return {"seq_id": 1}

    plan = FaultPlan(
        ["optim_step 500 x* match.seq_id=1", "asample 500 x* match.seq_id=1", "asample 501"]
    )
    plan.evaluate("POST", "/api/v1/healthz", "healthz", fields)
    assert calls == []
    plan.evaluate("POST", "/api/v1/asample", "asample", fields)
    assert calls == [1]


def test_assert_exhausted_names_pending_rules() -> None:
    plan = FaultPlan(["asample 429 x2", "optim_step 500 x*", "healthz 503"])
    evaluate(plan)
    evaluate(plan, "/api/v1/healthz")
    with pytest.raises(AssertionError) as info:
        plan.assert_exhausted()
    text = str(info.value)
    assert "asample 429" in text and "optim_step 500" in text and "healthz" not in text
    evaluate(plan)
    evaluate(plan, "/api/v1/optim_step")
    plan.assert_exhausted()
    plan.clear()
    assert plan.rules == [] and evaluate(plan) is None


def test_plan_budget_is_exact_under_concurrency() -> None:
    plan = FaultPlan(["asample 429 x500"])
    hits = []
    lock = threading.Lock()

    def worker() -> None:
        n = 0
        for _ in range(200):
            d = evaluate(plan)
            if d is not None and d.action is not None:
                n += 1
        with lock:
            hits.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(hits) == 500
    assert plan.rules[0].hits == 500 and plan.rules[0].seen == 500


def test_add_and_extend_return_live_rules() -> None:
    plan = FaultPlan()
    rule = plan.add(Fault(endpoint="asample", status=500, times=None))
    more = plan.extend(["optim_step drop-before", {"endpoint": "healthz", "status": 503}])
    assert [r.name for r in plan.rules] == ["asample 500", "optim_step drop-before", "healthz 503"]
    evaluate(plan)
    assert rule.hits == 1 and rule.remaining is None and more[0].remaining == 1
    with pytest.raises(ValueError):
        plan.extend(["asample 429", "bad bad"])  # validated before anything is added
    assert len(plan) == 3


# -- over HTTP ----------------------------------------------------------------------------


class CountingApp:
    def __init__(self) -> None:
        self.handled: list[str] = []

    async def handle(self, request: HttpRequest) -> HttpResponse:
        self.handled.append(request.path)
        pf = request.poll_fault
        request.log_proto = {"seq_id": 7} if request.path.endswith("forward_backward") else None
        return HttpResponse.json({"ok": True, "poll_fault": None if pf is None else pf.__dict__})

    def match_fields(self, request: HttpRequest) -> dict[str, Any]:
        kind = request.headers.get("x-kind")
        return {"request_type": kind} if kind else {}

    def endpoint_name(self, request: HttpRequest) -> str:
        return request.path


@pytest.fixture
def setup() -> Iterator[tuple[HttpServer, FaultPlan, RequestLog, CountingApp]]:
    app, plan, log = CountingApp(), FaultPlan(), RequestLog()
    srv = HttpServer(app, faults=plan, log=log)
    srv.start()
    yield srv, plan, log, app
    srv.stop()


def call(
    srv: HttpServer, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request("POST", "/api/v1/" + path, body=data, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_status_action_with_default_body_and_retry_headers(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, log, app = setup
    plan.add("asample 429 retry_after=0.5 retry_after_ms=250 should_retry=true headers.x-a=b")
    status, headers, body = call(srv, "asample", {"x": 1})
    assert status == 429
    assert json.loads(body) == {"detail": "injected fault: asample 429"}
    assert headers["retry-after"] == "0.5"
    assert headers["retry-after-ms"] == "250"
    assert headers["x-should-retry"] == "true"
    assert headers["x-a"] == "b"
    assert app.handled == []
    assert call(srv, "asample")[0] == 200  # budget of one
    recs = log.filter(endpoint="asample")
    assert [(r.status, r.fault) for r in recs] == [(429, "asample 429"), (200, None)]


def test_status_bodies(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, _, _ = setup
    plan.extend(
        [
            'asample 400 body={"detail": "custom"}',
            "asample 400 empty_body=true",
            "asample 502 body='<html>bad gateway</html>'",
            'asample 429 retry_after="soon"',
        ]
    )
    assert call(srv, "asample")[2] == b'{"detail":"custom"}'
    status, headers, body = call(srv, "asample")
    assert (status, headers["content-length"], body) == (400, "0", b"")
    status, headers, body = call(srv, "asample")
    assert (status, body) == (502, b"<html>bad gateway</html>")
    assert headers["content-type"].startswith("text/plain")
    assert call(srv, "asample")[1]["retry-after"] == "soon"


def test_retry_after_date_is_an_http_date_in_the_future(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, _, _ = setup
    plan.add("asample 503 retry_after_date=30")
    before = time.time()
    _, headers, _ = call(srv, "asample")
    when = email.utils.parsedate_to_datetime(headers["retry-after"]).timestamp()
    assert before + 29 <= when <= time.time() + 31


def test_delay_only_rule_delays_and_lets_the_handler_answer(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, log, app = setup
    plan.add("healthz delay=0.2 headers.x-slow=yes")
    status, headers, _ = call(srv, "healthz")
    assert status == 200 and headers["x-slow"] == "yes"
    assert app.handled == ["/api/v1/healthz"]
    [rec] = log.filter(endpoint="healthz")
    assert rec.duration_s >= 0.2 and rec.fault == "healthz delay=0.2 headers"


def test_drop_before_and_after_are_visible_in_the_log(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, log, app = setup
    plan.extend(["optim_step drop-before", "forward_backward drop-after"])
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        call(srv, "optim_step", {"seq_id": 1})
    assert app.handled == []  # the handler never ran
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        call(srv, "forward_backward", {"seq_id": 2})
    assert app.handled == ["/api/v1/forward_backward"]  # it ran; the reply was lost
    [before] = log.wait_for("optim_step", 1)
    [after] = log.wait_for("forward_backward", 1)
    assert (before.status, before.dropped, before.fault) == (
        None,
        "before",
        "optim_step drop-before",
    )
    assert (after.status, after.dropped) == (None, "after")
    assert after.proto == {"seq_id": 7} and before.json == {"seq_id": 1}
    assert len(log.filter(status="dropped")) == 2
    # retries go through
    assert call(srv, "optim_step")[0] == 200


def test_poll_actions_are_handed_to_the_app(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, log, _ = setup
    plan.extend(
        [
            'retrieve_future paused_rate_limit reason="limit hit"',
            "retrieve_future fail:user match.request_type=Sample message=nope",
            "retrieve_future expire match.request_type=ForwardBackward",
            "retrieve_future metadata",
        ]
    )
    pf = json.loads(call(srv, "retrieve_future", {"request_id": "r"})[2])["poll_fault"]
    assert pf["queue_state"] == "paused_rate_limit" and pf["reason"] == "limit hit"
    pf = json.loads(call(srv, "retrieve_future", headers={"x-kind": "ForwardBackward"})[2])[
        "poll_fault"
    ]
    assert pf["expire"] is True and pf["name"] == "retrieve_future expire"
    pf = json.loads(call(srv, "retrieve_future", headers={"x-kind": "Sample"})[2])["poll_fault"]
    assert (pf["fail"], pf["message"]) == ("user", "nope")
    pf = json.loads(call(srv, "retrieve_future", {"request_id": "r"})[2])["poll_fault"]
    assert pf["metadata_only"] is True
    assert json.loads(call(srv, "retrieve_future")[2])["poll_fault"] is None
    plan.assert_exhausted()
    assert [r.fault for r in log.filter(endpoint="retrieve_future")][:2] == [
        "retrieve_future paused_rate_limit",
        "retrieve_future expire",
    ]


def test_match_on_json_body_and_headers_over_http(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, _, _ = setup
    plan.extend(["asample 500 x* match.seq_id=2", "asample 501 x* match.header:x-mark=on"])
    assert call(srv, "asample", {"seq_id": 1})[0] == 200
    assert call(srv, "asample", {"seq_id": 2})[0] == 500
    assert call(srv, "asample", {"seq_id": 1}, {"X-Mark": "on"})[0] == 501


def test_full_path_glob_and_star_rule(setup) -> None:  # type: ignore[no-untyped-def]
    srv, plan, _, _ = setup
    plan.extend(["/api/v1/training_runs/** 404 x*", "* 418"])
    assert call(srv, "training_runs/r:1/checkpoints/weights/a")[0] == 404
    assert call(srv, "anything")[0] == 418
    assert call(srv, "anything")[0] == 200
