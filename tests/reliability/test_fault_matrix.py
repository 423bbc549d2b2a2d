"""Fault matrix: every fault kind of the local server crossed with training, sampling, REST
and client creation.

Each cell starts its own ``LocalServer`` (own port, own limiter key), creates the clients
fault-free, then installs the cell's fault rules and runs a small pipelined workload:

* training: fwd_bwd, optim_step, fwd_bwd, optim_step, fwd_bwd, optim_step (6 ops, not awaited
  one by one, so they pipeline through the sequencer);
* sampling: 8 concurrent ``sample`` calls with distinct prompts plus 2 ``compute_logprobs``;
* REST: list/get training runs, list checkpoints, get session and a ``copy_weights`` (a POST
  whose at-most-once effect is visible on the server);
* creation: the first use of a ServiceClient (config, session) plus ``create_lora_training_client``
  and ``create_sampling_client``, retried by the test (as a user would) when an attempt fails.

For every cell: every future resolves within the hang guard, to a result or a typed
``TinkerError`` -- and only the faults that are meant to fail an operation fail exactly the
expected number, with the expected class and ``outcome``; the server's state proves each
training seq_id was applied exactly once and in order (gaps only for ids that provably never
reached the handler), each seq_id / sampling seq_id kept one idempotency key across retries,
each sample answered exactly once with the answer of its own prompt, and a retried
``copy_weights`` made one copy. Backoff sleeps go through a ``FakeClock`` (the refused-connection
cells use the real clock, since the server refuses for real seconds).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from reliability_helpers import HANG, applied, datum, outcome_of, prompt, skipped, wait_all

import tinker_sync
from tinker_sync import types
from tinker_sync._runtime.clock import SYSTEM_CLOCK, Clock, FakeClock
from tinker_sync.exceptions import (
    APIStatusError,
    FutureExpiredError,
    InternalServerError,
    RequestErrorCategory,
    RequestFailedError,
    RequestLostError,
    RequestOutcome,
    TinkerError,
)
from tinker_sync.local import LocalServer

TARGETS = ("training", "sampling", "rest", "creation")

#: Training submission endpoints and the poll kinds of their futures.
TRAIN_EPS = ("forward_backward", "optim_step")
TRAIN_POLLS = ("ForwardBackward", "OptimStep")
#: REST endpoints used by the REST workload (one call each).
REST_EPS = (
    "training_runs",
    "training_runs/*",
    "training_runs/*/checkpoints",
    "sessions/*",
    "copy_weights",
)
#: Creation: session start, create_model (+ its poll), get_info, create_sampling_session.
CREATE_EPS = ("create_session", "create_model", "get_info", "create_sampling_session")
CREATE_ATTEMPTS = 3
SAMPLE_CALLS = 8
LOGPROB_CALLS = 2


@dataclasses.dataclass(frozen=True)
class Expect:
    """Expected failures of a cell: ``count`` ops fail with ``exc`` / ``outcome`` (/ category)."""

    count: int = 0
    exc: type[BaseException] = TinkerError
    outcome: RequestOutcome | None = None
    category: RequestErrorCategory | None = None


OK = Expect()


def sub(endpoints: tuple[str, ...], rule: str) -> list[str]:
    return [f"{ep} {rule}" for ep in endpoints]


def poll(kinds: tuple[str, ...], rule: str) -> list[str]:
    return [f"retrieve_future {rule} match.request_type={k}" for k in kinds]


def endpoints(target: str) -> tuple[str, ...]:
    return {
        "training": TRAIN_EPS,
        "sampling": ("asample",),
        "rest": REST_EPS,
        "creation": CREATE_EPS,
    }[target]


def poll_kinds(target: str) -> tuple[str, ...]:
    return {"training": TRAIN_POLLS, "sampling": ("Sample",), "creation": ("CreateModel",)}[target]


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """One row of the matrix: the rules per target (None: not applicable) and expectations."""

    name: str
    rules: Callable[[str], list[str] | None]
    expect: Callable[[str], Expect] = lambda target: OK
    real_clock: bool = False
    refuse_s: float = 0.0
    #: Retry-After style delay the client must honour (a retry/backoff hook event of ~this).
    honoured: tuple[float, float] | None = None


def _after(target: str) -> int:
    """Let the first matching request through (so faults hit mid-stream), except for REST and
    creation, where every call is a different endpoint."""
    return 0 if target in ("rest", "creation") else 1


def _terminal_eps(target: str) -> tuple[str, ...]:
    # Training: only forward_backward (so exactly one fwd op fails); creation: only
    # create_model (one failed attempt); others: every endpoint.
    return {"training": ("forward_backward",), "creation": ("create_model",)}.get(
        target, endpoints(target)
    )


def _rest_or_count(target: str, per_call: Expect, training: Expect, sampling: Expect) -> Expect:
    return {"training": training, "sampling": sampling, "rest": per_call, "creation": training}[
        target
    ]


FAULTS: list[FaultKind] = [
    FaultKind(
        "429_retry_after_seconds",
        lambda t: sub(endpoints(t), f"429 x2 after={_after(t)} retry_after=0.25"),
        honoured=(0.25, 0.25),
    ),
    FaultKind(
        "429_retry_after_ms",
        lambda t: sub(endpoints(t), f"429 x2 after={_after(t)} retry_after_ms=150"),
        honoured=(0.15, 0.15),
    ),
    FaultKind(
        "429_retry_after_http_date",
        lambda t: sub(endpoints(t), f"429 x1 after={_after(t)} retry_after_date=2"),
        # an HTTP-date has 1 s resolution: ceil(now + 2) - now in [2, 3), plus scheduling lag
        honoured=(1.5, 3.5),
    ),
    FaultKind(
        "5xx_burst",
        lambda t: [
            r
            for code in (500, 502, 503, 504)
            for r in sub(endpoints(t), f"{code} x1 after={_after(t)}")
        ],
    ),
    FaultKind("408", lambda t: sub(endpoints(t), f"408 x2 after={_after(t)}")),
    FaultKind("bare_400", lambda t: sub(endpoints(t), f"400 empty_body=true x2 after={_after(t)}")),
    FaultKind("drop_before", lambda t: sub(endpoints(t), f"drop-before x2 after={_after(t)}")),
    FaultKind("drop_after", lambda t: sub(endpoints(t), f"drop-after x2 after={_after(t)}")),
    FaultKind(
        "read_timeout",
        # delay 3 s > the client's 2 s read timeout: the reply is lost, the server acts later
        lambda t: sub(endpoints(t), f"delay=3 x1 after={_after(t)}"),
    ),
    FaultKind("refused_connections", lambda t: [], real_clock=True, refuse_s=1.5),
    FaultKind(
        "5xx_should_retry_false",
        lambda t: sub(_terminal_eps(t), f"503 should_retry=false x1 after={_after(t)}"),
        # Sampling: the sampling retry layer retries every 5xx with a NEW seq_id, whatever
        # x-should-retry says (docs/design/behavior.md#sampling-retry-layer, parity with the
        # official RetryHandler), so nothing fails.
        lambda t: (
            OK
            if t == "sampling"
            else Expect(
                len(_terminal_eps(t)) if t == "rest" else 1,  # creation: the first attempt
                InternalServerError,
                RequestOutcome.UNKNOWN,
            )
        ),
    ),
    FaultKind(
        "410_expired",
        lambda t: (
            sub(REST_EPS, "410 x1")
            if t == "rest"
            else poll(("ForwardBackward",) if t == "training" else poll_kinds(t), "expire x1")
        ),
        lambda t: _rest_or_count(
            t,
            per_call=Expect(len(REST_EPS), APIStatusError, RequestOutcome.REJECTED),
            training=Expect(1, FutureExpiredError, RequestOutcome.UNKNOWN),
            sampling=OK,  # a polled 410 resubmits the sample with a new seq_id (docs/design/behavior.md#sampling-retry-layer)
        ),
    ),
    FaultKind(
        "poll_404_lost",
        # the server no longer knows the request (docs/polling.md#lost-requests)
        lambda t: (
            None
            if t == "rest"
            else poll(("ForwardBackward",) if t == "training" else poll_kinds(t), "404 x1")
        ),
        lambda t: _rest_or_count(
            t,
            per_call=OK,
            training=Expect(1, RequestLostError, RequestOutcome.UNKNOWN),
            sampling=OK,  # resubmitted under a new seq_id (at most twice)
        ),
    ),
    FaultKind(
        "paused_queue",
        lambda t: (
            None
            if t == "rest"
            else poll(poll_kinds(t), "paused_rate_limit x3 reason='limit hit'")
            + poll(poll_kinds(t), "paused_capacity x2")
        ),
    ),
    FaultKind(
        "fail_user",
        lambda t: None if t == "rest" else poll(poll_kinds(t)[:1], "fail:user x1"),
        lambda t: Expect(1, RequestFailedError, RequestOutcome.REJECTED, RequestErrorCategory.User),
    ),
    FaultKind(
        "fail_server",
        lambda t: None if t == "rest" else poll(poll_kinds(t)[:1], "fail:server x1"),
        lambda t: Expect(
            1, RequestFailedError, RequestOutcome.REJECTED, RequestErrorCategory.Server
        ),
    ),
    FaultKind(
        "metadata_only",
        lambda t: None if t == "rest" else poll(poll_kinds(t), "metadata x*"),
    ),
    FaultKind("poll_5xx", lambda t: None if t == "rest" else poll(poll_kinds(t), "503 x3")),
    FaultKind("poll_429", lambda t: None if t == "rest" else poll(poll_kinds(t), "429 x2")),
    FaultKind("poll_408", lambda t: None if t == "rest" else poll(poll_kinds(t), "408 x3")),
    FaultKind(
        "poll_drop_after", lambda t: None if t == "rest" else poll(poll_kinds(t), "drop-after x2")
    ),
    FaultKind(
        "poll_400_with_body", lambda t: None if t == "rest" else poll(poll_kinds(t), "400 x2")
    ),
]

CELLS = [
    pytest.param(fk, target, id=f"{target}-{fk.name}")
    for fk, target in itertools.product(FAULTS, TARGETS)
    if fk.rules(target) is not None
]


# ---------------------------------------------------------------------------------------------
# workloads


@dataclasses.dataclass
class Op:
    label: str
    future: concurrent.futures.Future[Any]
    kind: str = ""
    seq_id: int | None = None
    prompt_index: int | None = None
    callbacks: list[int] = dataclasses.field(default_factory=list)


def run_training(training: Any) -> list[Op]:
    ops: list[Op] = []
    for step in range(3):
        ops.append(
            Op(
                f"fwd{step}",
                training.forward_backward([datum(step)], "cross_entropy"),
                "ForwardBackward",
                seq_id=2 * step + 1,
            )
        )
        ops.append(
            Op(
                f"optim{step}",
                training.optim_step(types.AdamParams(learning_rate=1e-3)),
                "OptimStep",
                seq_id=2 * step + 2,
            )
        )
    return ops


SAMPLE_PARAMS = types.SamplingParams(max_tokens=5, seed=11, temperature=0.7)


def sample_calls(sampler: Any) -> list[Op]:
    ops = [
        Op(f"sample{i}", sampler.sample(prompt(i), 2, SAMPLE_PARAMS), "Sample", prompt_index=i)
        for i in range(SAMPLE_CALLS)
    ]
    ops += [
        Op(
            f"logprobs{i}",
            sampler.compute_logprobs(prompt(100 + i)),
            "Logprobs",
            prompt_index=100 + i,
        )
        for i in range(LOGPROB_CALLS)
    ]
    for op in ops:
        op.future.add_done_callback(lambda f, op=op: op.callbacks.append(1))
    return ops


def run_creation(service: Any) -> tuple[list[Op], list[Any]]:
    """Create a training and a sampling client, retrying a failed attempt like a user would
    (at most CREATE_ATTEMPTS); each attempt is one Op, run on a thread under the hang guard."""
    ops: list[Op] = []
    clients: list[Any] = []

    def attempt() -> Any:
        training = service.create_lora_training_client("base", rank=4)
        sampler = service.create_sampling_client(base_model="base")
        return training, sampler

    for i in range(CREATE_ATTEMPTS):
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        worker = threading.Thread(target=_settle, args=(fut, attempt), daemon=True)
        worker.start()
        wait_all([fut], HANG)
        ops.append(Op(f"create{i}", fut))
        if fut.exception(0) is None:
            clients = list(fut.result(0))
            break
    return ops, clients


def _settle(fut: concurrent.futures.Future[Any], fn: Callable[[], Any]) -> None:
    try:
        fut.set_result(fn())
    except BaseException as exc:
        fut.set_exception(exc)


def run_rest(rest: Any, run_id: str, session_id: str, ckpt_path: str) -> list[Op]:
    return [
        Op("list_training_runs", rest.list_training_runs()),
        Op("get_training_run", rest.get_training_run(run_id)),
        Op("list_checkpoints", rest.list_checkpoints(run_id)),
        Op("get_session", rest.get_session(session_id)),
        Op("copy_weights", rest.copy_weights(ckpt_path, "proj-reliability")),
    ]


# ---------------------------------------------------------------------------------------------
# checks


def check_failures(ops: list[Op], expect: Expect) -> list[Op]:
    """Every op resolved to a result or a typed TinkerError; failures match ``expect``."""
    failed = []
    for op in ops:
        _, exc = outcome_of(op.future)
        if exc is None:
            continue
        assert isinstance(exc, TinkerError), f"{op.label}: untyped {type(exc).__name__}: {exc!r}"
        failed.append(op)
    desc = {op.label: repr(op.future.exception(0)) for op in failed}
    assert len(failed) == expect.count, f"expected {expect.count} failure(s), got {desc}"
    for op in failed:
        exc = op.future.exception(0)
        assert isinstance(exc, expect.exc), f"{op.label}: {exc!r} is not {expect.exc.__name__}"
        if expect.outcome is not None:
            assert exc.outcome is expect.outcome, f"{op.label}: {exc!r} outcome {exc.outcome}"
        if expect.category is not None:
            assert exc.category is expect.category, f"{op.label}: {exc!r}"
    return failed


def idempotency_keys_by(records: list[Any], key: Callable[[Any], Any]) -> dict[Any, set[str]]:
    out: dict[Any, set[str]] = collections.defaultdict(set)
    for rec in records:
        out[key(rec)].add(rec.headers.get("x-idempotency-key", ""))
    return out


def check_training(
    server: Any, training: Any, ops: list[Op], failed: list[Op], fk: FaultKind
) -> None:
    model_id = training.model_id
    gaps = skipped(server, model_id)
    # Only an op whose every attempt was answered by the fault (never reached the handler)
    # may leave a gap, and then the server skipped exactly its seq_id.
    expected_gaps = sorted(op.seq_id for op in failed if fk.name == "5xx_should_retry_false")
    assert gaps == expected_gaps, f"skipped seq_ids {gaps}, expected {expected_gaps}"
    want = [(0, "CreateModel")] + [(op.seq_id, op.kind) for op in ops if op.seq_id not in gaps]
    assert applied(server, model_id) == want, "training ops not applied exactly once in order"
    table = server.app._futures
    for op in ops:
        if op.future.exception(0) is None:
            rec = table.get(op.future.request_id)
            assert rec is not None and rec.seq_id == op.seq_id, (op.label, rec and rec.seq_id)
    # every attempt of one seq_id carried one idempotency key, and keys differ across seq_ids
    subs = [
        r
        for ep in TRAIN_EPS
        for r in server.requests.filter(endpoint=ep)
        if (r.proto or r.json or {}).get("model_id") == model_id
    ]
    by_seq = idempotency_keys_by(subs, lambda r: (r.proto or r.json)["seq_id"])
    assert all(len(keys) == 1 for keys in by_seq.values()), by_seq
    all_keys = [next(iter(k)) for k in by_seq.values()]
    assert len(set(all_keys)) == len(all_keys)


def check_sampling(
    server: Any,
    ops: list[Op],
    reference: dict[int, Any],
    fk: FaultKind,
    records: list[Any],
    hits: int,
) -> None:
    for op in ops:
        assert op.callbacks == [1], f"{op.label} completed {len(op.callbacks)} times"
    asamples = [r for r in records if r.json]
    # one seq_id per call, plus one fresh seq_id per sampling-layer retry
    # (docs/design/behavior.md#sampling-lock-free-seq-ids,
    # docs/design/behavior.md#sampling-retry-layer): only the faults that fail an accepted sample
    # (polled 410) or a 5xx the HTTP layers gave up on
    resubmits = fk.name in ("410_expired", "5xx_should_retry_false", "poll_404_lost")
    fresh = hits if resubmits else 0
    assert len({r.json["seq_id"] for r in asamples}) == len(ops) + fresh
    by_seq_prompt: dict[int, set[str]] = collections.defaultdict(set)
    for r in asamples:
        by_seq_prompt[r.json["seq_id"]].add(repr(r.json["prompt"]))
    assert all(len(p) == 1 for p in by_seq_prompt.values()), "one seq_id carried two prompts"
    by_seq_key = idempotency_keys_by(asamples, lambda r: r.json["seq_id"])
    assert all(len(k) == 1 for k in by_seq_key.values()), by_seq_key
    table = server.app._futures
    for op in ops:
        value, exc = outcome_of(op.future)
        if exc is not None:
            continue
        assert op.prompt_index is not None
        assert fingerprint(value) == fingerprint(reference[op.prompt_index]), (
            f"{op.label} got another prompt's answer"
        )
        if op.kind != "Sample":
            continue
        # the answer came from a server future whose seq_id carried this call's prompt
        rids = {seq.sequence_id.rsplit(":", 1)[0] for seq in value.sequences}
        assert len(rids) == 1, rids
        rec = table.get(rids.pop())
        assert rec is not None and rec.seq_id is not None
        assert by_seq_prompt[rec.seq_id] == {repr(prompt_json(op.prompt_index))}


def fingerprint(value: Any) -> Any:
    """What must not differ between two answers to the same prompt (ids aside)."""
    if isinstance(value, list):  # compute_logprobs
        return tuple(None if v is None else round(v, 5) for v in value)
    return tuple(
        (tuple(seq.tokens), str(seq.stop_reason), tuple(round(x, 5) for x in seq.logprobs or ()))
        for seq in value.sequences
    )


def wait_delayed(server: Any) -> None:
    """Wait until every request held by a ``delay`` rule has been handled and logged, so the
    late original of a timed-out request is part of what the checks see."""
    deadline = time.monotonic() + HANG
    for rule in server.faults.rules:
        if not rule.fault.delay:
            continue
        while sum(r.fault == rule.name for r in server.requests.all()) < rule.hits:
            assert time.monotonic() < deadline, f"delayed request of {rule.name} never logged"
            server.requests.wait_for(None, len(server.requests) + 1, timeout=HANG)


def prompt_json(i: int) -> Any:
    from tinker_sync._wire._converter import to_json

    return to_json(prompt(i))


def check_rest(server: Any, ops: list[Op]) -> None:
    copy_op = next(op for op in ops if op.label == "copy_weights")
    copies = [s for s in server.state()["sessions"] if s.startswith("copy-")]
    value, exc = outcome_of(copy_op.future)
    keys = {
        r.headers.get("x-idempotency-key") for r in server.requests.filter(endpoint="copy_weights")
    }
    assert len(keys) == 1, f"copy_weights attempts used {len(keys)} idempotency keys"
    if exc is None:
        assert len(copies) == 1, f"a retried copy_weights made {len(copies)} copies"
        assert value.startswith("tinker://copy-")
    else:
        # the fault answered every attempt: the handler never ran
        assert copies == []


def handled(rec: Any) -> bool:
    """The server's handler ran for this request (its reply may have been lost)."""
    return (
        (rec.status is not None and rec.status < 400 and not rec.fault)
        or (rec.dropped == "after")
        or (rec.fault and "delay" in rec.fault and rec.status == 200)
    )


def check_creation(server: Any, service: Any, ops: list[Op], clients: list[Any]) -> None:
    assert clients, "no creation attempt succeeded"
    training, sampler = clients
    state = server.state()
    # one model per logical create_model (key: session_id + model_seq_id), however many times
    # the request was retried or its reply lost; likewise for sampling sessions
    creates = [r for r in server.requests.filter(endpoint="create_model") if handled(r)]
    want_models = {f"{r.json['session_id']}:train:{r.json['model_seq_id']}" for r in creates}
    assert set(state["models"]) == want_models
    assert training.model_id in want_models
    samplings = [
        r for r in server.requests.filter(endpoint="create_sampling_session") if handled(r)
    ]
    keys = {(r.json["session_id"], r.json["sampling_session_seq_id"]) for r in samplings}
    assert len(state["samplers"]) == len(keys), (state["samplers"], keys)
    assert sampler.sampler_id in state["samplers"]
    # create_session is not deduplicated (docs/design/behavior.md#submission-loop: not under the
    # submission loop, no server-side key): a session whose reply was lost stays behind, empty,
    # until it expires
    sessions = [r for r in server.requests.filter(endpoint="create_session") if handled(r)]
    assert len(state["sessions"]) == len(sessions)
    assert service._session.session_id in state["sessions"]
    for sid, info in state["sessions"].items():
        if sid != service._session.session_id:
            assert info["models"] == [] and info["samplers"] == [], (sid, info)


def check_honoured(events: list[Any], lo: float, hi: float) -> None:
    delays = [
        float(e["delay"] if e.kind == "retry_scheduled" else e["seconds"])
        for e in events
        if e.kind in ("retry_scheduled", "backoff_set")
    ]
    assert any(lo - 1e-6 <= d <= hi + 1e-6 for d in delays), (
        f"no retry/backoff of {lo}..{hi} s was scheduled; saw {delays}"
    )


# ---------------------------------------------------------------------------------------------
# the matrix


@pytest.mark.parametrize(("fk", "target"), CELLS)
def test_cell(fk: FaultKind, target: str) -> None:
    clock: Clock = SYSTEM_CLOCK if fk.real_clock else FakeClock(wall=time.time(), seed=len(fk.name))
    events: list[Any] = []
    started = time.monotonic()
    with LocalServer(long_poll_s=1.0, api_key=None, gap_grace_s=1.0) as server:
        service = tinker_sync.ServiceClient(
            base_url=server.url,
            api_key="tml-" + secrets.token_hex(20),
            timeout=tinker_sync.Timeout(2.0, connect=1.0),
            hooks=[events.append],
            _clock=clock,
        )
        try:
            if target != "creation":
                training = service.create_lora_training_client("base", rank=4)
                sampler = service.create_sampling_client(base_model="base")
                rest = service.create_rest_client()
                run_id = training.model_id
            ckpt = None
            if target == "rest":
                ckpt = training.save_state("ckpt").result(HANG).path
                training = None
            rules = fk.rules(target)
            assert rules is not None
            server.faults.extend(rules)
            server.requests.clear()
            events.clear()
            if isinstance(clock, FakeClock):
                clock.set_wall(time.time())  # HTTP-date Retry-After is computed on real time
            if fk.refuse_s:
                server.refuse_connections(fk.refuse_s)
            if target == "training":
                ops = run_training(training)
            elif target == "sampling":
                ops = sample_calls(sampler)
            elif target == "rest":
                ops = run_rest(rest, run_id, service._session.session_id, ckpt)
            else:
                ops, clients = run_creation(service)
            wait_all([op.future for op in ops], HANG)
            wait_delayed(server)
            failed = check_failures(ops, fk.expect(target))
            server.faults.assert_exhausted()  # every rule was applied its full budget
            if fk.honoured is not None:
                check_honoured(events, *fk.honoured)
            if target == "training":
                check_training(server, training, ops, failed, fk)
            elif target == "sampling":
                records = server.requests.filter(endpoint="asample")
                hits = sum(r.hits for r in server.faults.rules)
                server.faults.clear()
                ref_ops = sample_calls(sampler)
                wait_all([op.future for op in ref_ops], HANG)
                reference = {op.prompt_index: op.future.result(0) for op in ref_ops}
                check_sampling(server, ops, reference, fk, records, hits)
            elif target == "rest":
                check_rest(server, ops)
            else:
                check_creation(server, service, ops, clients)
        finally:
            service.close()
    assert time.monotonic() - started < HANG


# ---------------------------------------------------------------------------------------------
# outcomes at the edges of the matrix


def test_refused_for_good_fails_typed_as_not_sent() -> None:
    """Connections refused longer than every retry budget (on fake clocks): training and REST calls
    fail typed (StalledError, APIConnectError), outcome NOT_SENT; sampling, which retries connection
    errors without a count limit (docs/design/behavior.md#sampling-retry-layer), fails with
    SamplingStuckError once its progress timeout passes -- and indeed nothing reached the server.
    One client (and clock) per call, each starting at virtual time 0 (see
    test_submission_budget_ends_whatever_the_clock_reads)."""
    with LocalServer(long_poll_s=1.0, api_key=None, gap_grace_s=1.0) as server:
        clocks = [FakeClock(wall=time.time(), seed=k) for k in range(3)]
        services = [
            tinker_sync.ServiceClient(
                base_url=server.url, api_key="tml-" + secrets.token_hex(20), _clock=clock
            )
            for clock in clocks
        ]
        try:
            training = services[0].create_lora_training_client("base", rank=4)
            sampler = services[1].create_sampling_client(
                base_model="base", retry_config=tinker_sync.RetryConfig(progress_timeout=100.0)
            )
            rest = services[2].create_rest_client()
            server.requests.clear()
            server.refuse_connections(HANG)
            futures = [
                training.forward_backward([datum(0)], "cross_entropy"),
                sampler.sample(prompt(0), 1, SAMPLE_PARAMS),
                rest.list_training_runs(),
            ]
            wait_all(futures, HANG)
            train_exc, sample_exc, rest_exc = (f.exception(0) for f in futures)
            # training (its server answered before): retried until stall_timeout, then a stall
            # that knows no attempt reached the server; REST (this client never got an
            # answer): the HTTP retries within `timeout` were its whole budget
            assert isinstance(train_exc, tinker_sync.StalledError), repr(train_exc)
            assert isinstance(train_exc.__cause__, tinker_sync.APIConnectError)
            assert isinstance(rest_exc, tinker_sync.APIConnectError), repr(rest_exc)
            for exc in (train_exc, rest_exc):
                assert exc.outcome is RequestOutcome.NOT_SENT
            # that error cannot know what the server did with earlier attempts: UNKNOWN
            assert isinstance(sample_exc, tinker_sync.SamplingStuckError), repr(sample_exc)
            assert sample_exc.outcome is RequestOutcome.UNKNOWN
            assert sum(r.endpoint != "session_heartbeat" for r in server.requests.all()) == 0
            assert applied(server, training.model_id) == [(0, "CreateModel")]
            # the 600 s stall_timeout (HTTP retries included) ran on the fake clock
            assert sum(seconds for seconds, _ in clocks[0].sleeps) >= 600
            assert sum(seconds for seconds, _ in clocks[2].sleeps) <= 60
        finally:
            for service in services:
                service.close()


def test_submission_budget_ends_whatever_the_clock_reads() -> None:
    """The 300 s submission budget ends for every clock reading. Started at virtual time
    212.3 (about 1 start in 12 behaves like this), the trimmed last wait is 0 s while
    ``now - start`` stays a hair under 300, so the loop never stops on a virtual clock (a hang,
    busy-looping against the server); on a real clock, a burst of immediate extra retries.

    See docs/design/behavior.md#submission-loop.
    """
    from tinker_sync._flow.retry import SubmissionRetry, submission_loop

    calls = 0

    def refused() -> None:
        nonlocal calls
        calls += 1
        if calls > 100:
            raise OverflowError("still retrying after 100 attempts")
        raise tinker_sync.APIConnectError("connection refused")

    with pytest.raises(tinker_sync.APIConnectError):
        submission_loop(refused, SubmissionRetry(clock=FakeClock(monotonic=212.3)))
    assert calls <= 20
