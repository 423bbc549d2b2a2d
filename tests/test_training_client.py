"""TrainingClient ordering and failure isolation against the real local server (area A)."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types

HANG = 60.0


def datum(n: int = 4, offset: int = 0) -> types.Datum:
    tokens = np.arange(offset, offset + n + 1, dtype=np.int64) % 250
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": np.ones(n, np.float32)},
    )


def applied(server, model_id: str) -> list[tuple[int, str]]:
    return [tuple(x) for x in server.app.applied(model_id)]


def test_64_threads_each_send_fwd_bwd_then_optim_step_in_order(server, service):
    """Seq ids are contiguous; each thread's fwd precedes its optim_step
    (docs/design/behavior.md#reserve-at-call-time,
    docs/design/behavior.md#send-order-and-chunk-fanout)."""
    training = service.create_lora_training_client("base", rank=4)
    barrier = threading.Barrier(64)
    pairs: list[tuple[concurrent.futures.Future, concurrent.futures.Future]] = [None] * 64  # type: ignore[list-item]

    def worker(i: int) -> None:
        barrier.wait(HANG)
        fwd = training.forward_backward([datum(offset=i)], "cross_entropy")
        opt = training.optim_step(types.AdamParams())
        pairs[i] = (fwd, opt)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    for fwd, opt in pairs:
        fwd.result(HANG)
        opt.result(HANG)
    log = applied(server, training.model_id)
    assert [s for s, _ in log] == list(range(0, 129))  # create_model is seq 0, then contiguous
    futures = server.app._futures
    for fwd, opt in pairs:
        fwd_seq = futures.get(fwd.request_id).seq_id
        opt_seq = futures.get(opt.request_id).seq_id
        assert fwd_seq < opt_seq, (fwd_seq, opt_seq)
    assert sum(kind == "ForwardBackward" for _, kind in log) == 64
    assert sum(kind == "OptimStep" for _, kind in log) == 64


def small(n: int) -> list[types.Datum]:
    return [datum(2, offset=i) for i in range(n)]


def fwd_arrivals(server) -> list[int]:
    return [
        r.proto["seq_id"]
        for r in server.requests.filter(endpoint="forward_backward")
        if r.status == 200
    ]


@pytest.mark.parametrize("parallel", [True, False])
def test_3000_datums_go_as_3_chunks_lowest_last_then_optim_step(parallel):
    """Chunk order follows the server's policy; optim_step comes after
    (docs/design/behavior.md#send-order-and-chunk-fanout, docs/design/behavior.md#fwdbwd-chunking).
    """
    from tinker_sync.local import LocalServer

    config = {"parallel_fwdbwd_chunks": parallel}
    with LocalServer(client_config=config, long_poll_s=2.0) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            training = service.create_lora_training_client("base", rank=4)
            fwd = training.forward_backward(small(3000), "cross_entropy")
            opt = training.optim_step(types.AdamParams())
            out = fwd.result(HANG)
            opt.result(HANG)
            assert len(out.loss_fn_outputs) == 3000
            assert len(fwd.request_ids) == 3
            arrivals = fwd_arrivals(server)
            if parallel:
                assert sorted(arrivals[:2]) == [2, 3] and arrivals[2] == 1
            else:
                assert arrivals == [1, 2, 3]
            (opt_req,) = server.requests.filter(endpoint="optim_step")
            assert opt_req.json["seq_id"] == 4
            fwd_times = [r.time for r in server.requests.filter(endpoint="forward_backward")]
            assert opt_req.time >= max(fwd_times)
            assert [s for s, _ in applied(server, training.model_id)] == [0, 1, 2, 3, 4]


def test_retried_chunk_reuses_seq_id_and_idempotency_key(server):
    """500, 500, 200 share seq_id and key; the next op leaves after
    (docs/design/behavior.md#turn-covers-send-and-retries, docs/design/behavior.md#idempotency-key).
    """
    from tinker_sync._runtime.clock import FakeClock

    clock = FakeClock(rng=lambda: 0.0)  # jitter factor 1 - 0.25 * r: the top of the range
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, _clock=clock)
    try:
        training = service.create_lora_training_client("base", rank=4)
        server.faults.add("forward_backward 500 x2")
        fwd = training.forward_backward([datum()], "cross_entropy")
        opt = training.optim_step(types.AdamParams())
        fwd.result(HANG)
        opt.result(HANG)
        attempts = server.requests.filter(endpoint="forward_backward")
        assert [r.status for r in attempts] == [500, 500, 200]
        assert {r.proto["seq_id"] for r in attempts} == {1}
        keys = {r.headers["x-idempotency-key"] for r in attempts}
        assert len(keys) == 1 and None not in keys
        (opt_req,) = server.requests.filter(endpoint="optim_step")
        assert opt_req.time >= attempts[-1].time
        assert clock.sleeps_for("http-retry") == [0.5, 1.0]
    finally:
        service.close()


def test_cancel_returns_false_and_the_op_is_still_sent(server, service):
    """A queued training handle cannot be cancelled; 20 later ops complete
    (docs/design/behavior.md#training-not-cancellable)."""
    training = service.create_lora_training_client("base", rank=4)
    first = training.forward_backward([datum()], "cross_entropy")
    assert first.cancel() is False
    later = [training.optim_step(types.AdamParams()) for _ in range(20)]
    first.result(HANG)
    for f in later:
        f.result(HANG)
    assert [s for s, _ in applied(server, training.model_id)] == list(range(22))


def test_optim_step_is_accepted_while_fwd_result_is_held():
    """Polling never holds the turn; optim_step is sent while fwd is pending
    (docs/design/behavior.md#turn-covers-send-and-retries)."""
    from tinker_sync.local import LocalServer

    with LocalServer(long_poll_s=1.0) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            training = service.create_lora_training_client("base", rank=4)
            server.pause("paused_capacity", kind="training")
            fwd = training.forward_backward([datum()], "cross_entropy")
            opt = training.optim_step(types.AdamParams())
            server.requests.wait_for("optim_step", 1, timeout=HANG)
            assert not fwd.done()
            server.resume()
            fwd.result(HANG)
            opt.result(HANG)


def test_validation_errors_consume_no_seq_id(server, service):
    """Every local error is raised before a seq_id is taken
    (docs/design/behavior.md#validate-before-reserving)."""
    training = service.create_lora_training_client("base", rank=4)
    pointer = types.ImageAssetPointerChunk(format="png", location="x", expected_tokens=2)
    bad_calls = [
        lambda: training.forward_backward([], "cross_entropy"),
        lambda: training.forward_backward([datum()], "not_a_loss"),
        lambda: training.forward_backward(
            [
                types.Datum(
                    model_input=types.ModelInput(chunks=[pointer]),
                    loss_fn_inputs={"target_tokens": [1, 2]},
                )
            ],
            "cross_entropy",
        ),
        lambda: training.optim_step(),
        lambda: training.optim_step(types.AdamParams(), adam_params=types.AdamParams()),
        lambda: training.optim_step("adam"),  # type: ignore[arg-type]
        lambda: training.save_state(""),
        lambda: training.save_state("a/b"),
        lambda: training.load_state("not-a-tinker-path"),
    ]
    for call in bad_calls:
        with pytest.raises((ValueError, TypeError)):
            call()
    assert training._sequencer.next_seq_id == 1
    training.optim_step(types.AdamParams()).result(HANG)
    assert [s for s, _ in applied(server, training.model_id)] == [0, 1]
    assert server.requests.count("forward_backward") == 0


def test_32_clients_8_threads_mixed_ops_all_finish(server, service):
    """No pool deadlock with many clients and threads
    (docs/design/behavior.md#send-order-and-chunk-fanout, docs/design/behavior.md#thread-inventory).
    """
    from tinker_sync._runtime.executor import _pools, configure_threads

    clients = [service.create_lora_training_client("base", rank=4) for _ in range(32)]
    barrier = threading.Barrier(8)
    futures: list[concurrent.futures.Future] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        barrier.wait(HANG)
        for j, training in enumerate(clients):
            fs = [
                training.forward_backward(small(3), "cross_entropy"),
                training.optim_step(types.AdamParams()),
            ]
            if (j + k) % 8 == 0:
                fs.append(training.forward(small(2), "cross_entropy"))
            with lock:
                futures.extend(fs)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    done, not_done = concurrent.futures.wait(futures, timeout=HANG * 2)
    assert not not_done
    assert all(f.exception() is None for f in done)
    for training in clients:
        seqs = [s for s, _ in applied(server, training.model_id)]
        assert seqs == list(range(len(seqs)))
    del configure_threads, _pools


def test_metadata_calls_do_not_queue_behind_a_held_send(server, service):
    """``get_info`` and ``get_tokenizer`` return while a submission is held open
    (docs/design/behavior.md#metadata-bypasses-sequencer)."""
    training = service.create_lora_training_client("base", rank=4)
    server.faults.add("forward_backward delay=3")
    fwd = training.forward_backward([datum()], "cross_entropy")
    server.requests.wait_for("forward_backward", 0, timeout=HANG)
    assert training.get_info().model_id == training.model_id
    tok = training.get_tokenizer()
    assert tok.decode(tok.encode("hi", add_special_tokens=False)) == "hi"
    assert not fwd.done()
    fwd.result(HANG)


def test_a_rejected_chunk_fails_only_its_op_and_names_the_accepted_chunks():
    """Op k fails with the chunk's error; op k+1 takes the next id and completes
    (docs/design/behavior.md#failed-send-fails-one-op)."""
    from tinker_sync.exceptions import BadRequestError
    from tinker_sync.local import LocalServer

    config = {"parallel_fwdbwd_chunks": False, "fwdbwd_max_chunk_len": 2}
    with LocalServer(client_config=config, gap_grace_s=0.2, long_poll_s=2.0) as server:
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            training = service.create_lora_training_client("base", rank=4)
            server.faults.add("forward_backward 400 after=1 x1")  # the second chunk
            failed = training.forward_backward(small(4), "cross_entropy")  # seq 1, 2
            nxt = training.forward_backward(small(1), "cross_entropy")  # seq 3
            exc = failed.exception(HANG)
            assert isinstance(exc, BadRequestError)
            assert exc.accepted_chunks == [1]  # type: ignore[attr-defined]
            assert any("chunk 2/2" in note for note in getattr(exc, "__notes__", []))
            assert nxt.result(HANG).metrics
            assert [s for s, _ in applied(server, training.model_id)] == [0, 1, 3]


# ------------------------------------------------------------------------------


def test_a_callback_that_submits_the_next_op_does_not_deadlock(server, service):
    """Futures complete outside every SDK lock, so a done-callback may re-enter
    the client (submit, and even wait for, the next op) on the completing thread.

    See docs/design/behavior.md#never-drop-a-failure.
    """
    training = service.create_lora_training_client("base", rank=4)
    finished = threading.Event()
    chain: list[int] = []
    errors: list[BaseException] = []

    def step(fut: concurrent.futures.Future, k: int) -> None:
        try:
            fut.result()
            chain.append(k)
            if k == 20:
                finished.set()
                return
            nxt = (
                training.forward_backward([datum(offset=k)], "cross_entropy")
                if k % 2
                else training.optim_step(types.AdamParams())
            )
            if k % 5 == 0:
                nxt.result(HANG)  # blocking inside a callback: still no deadlock
            nxt.add_done_callback(lambda f: step(f, k + 1))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            finished.set()

    first = training.forward_backward([datum()], "cross_entropy")
    first.add_done_callback(lambda f: step(f, 0))
    assert finished.wait(HANG), f"chain stalled after {chain[-1:]}"
    assert not errors
    assert chain == list(range(21))
    assert [s for s, _ in applied(server, training.model_id)] == list(range(22))


def test_a_raising_callback_is_isolated(server, service, caplog):
    """A raising callback is logged; other callbacks and the result are intact
    (docs/design/behavior.md#never-drop-a-failure)."""
    import logging

    training = service.create_lora_training_client("base", rank=4)
    seen: list[str] = []

    def boom(fut: concurrent.futures.Future) -> None:
        seen.append("boom")
        raise RuntimeError("callback failure")

    after = threading.Event()

    def record(fut: concurrent.futures.Future) -> None:
        seen.append("after")
        after.set()

    with caplog.at_level(logging.ERROR, logger="tinker_sync.futures"):
        fut = training.forward_backward([datum()], "cross_entropy")
        fut.add_done_callback(boom)
        fut.add_done_callback(record)
        out = fut.result(HANG)
        assert after.wait(HANG)  # callbacks run in order on the completing thread
        nxt = training.optim_step(types.AdamParams())
        assert nxt.result(HANG) is not None
    assert isinstance(out, types.ForwardBackwardOutput)
    assert seen == ["boom", "after"]
    failures = [r for r in caplog.records if "done-callback" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None


# ------------------------------------------------------------------------------


def test_one_idempotency_key_across_both_retry_layers(server):
    """11 HTTP attempts (500) exhaust the HTTP layer; the submission loop resends
    with the same key; an identical second call gets a new key; GETs carry none.

    See docs/design/behavior.md#idempotency-key.
    """
    from tinker_sync._runtime.clock import FakeClock

    clock = FakeClock(rng=lambda: 0.0)
    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, _clock=clock)
    try:
        training = service.create_lora_training_client("base", rank=4)
        server.faults.add("optim_step 500 x11")
        first = training.optim_step(types.AdamParams(learning_rate=1e-4))
        first.result(HANG)
        second = training.optim_step(types.AdamParams(learning_rate=1e-4))
        second.result(HANG)
        attempts = server.requests.filter(endpoint="optim_step")
        assert [r.status for r in attempts] == [500] * 11 + [200, 200]
        first_keys = {r.headers["x-idempotency-key"] for r in attempts[:12]}
        assert len(first_keys) == 1
        assert attempts[12].headers["x-idempotency-key"] not in first_keys
        assert {r.json["seq_id"] for r in attempts[:12]} == {1}
        assert attempts[12].json["seq_id"] == 2
        retry_counts = [int(r.headers["x-stainless-retry-count"]) for r in attempts[:12]]
        assert retry_counts == list(range(11)) + [0]
        assert len(clock.sleeps_for("http-retry")) == 10
        assert clock.sleeps_for("submission-retry") == [1.0]
        # GET requests carry no key
        sampler = training.save_weights_for_sampler("s").result(HANG)
        service.create_sampling_client(model_path=sampler.path)
        gets = server.requests.filter(method="GET")
        assert gets, "expected at least one GET (samplers lookup)"
        assert all("x-idempotency-key" not in r.headers for r in gets)
        posts = server.requests.filter(method="POST")
        assert all("x-idempotency-key" in r.headers for r in posts)
    finally:
        service.close()


# ------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_clients_with_40mb_chunks_under_the_50mb_budget_do_not_deadlock():
    """The fwd/bwd byte gate is taken inside each chunk's turn, so two clients
    whose chunks are 40 MB each (budget 50 MB, admitted while >= 0) all finish.

    See docs/design/behavior.md#fwdbwd-byte-gate.
    """
    from tinker_sync._wire._chunking import estimate_datum_bytes
    from tinker_sync.local import LocalServer

    per_datum = 25_000  # 16 B per token estimated: 400 kB per datum, 100 datums per chunk
    config = {"fwdbwd_max_chunk_bytes_count": 40_000_000, "fwdbwd_max_chunk_len": 1024}
    big = [
        types.Datum(
            model_input=types.ModelInput.from_ints(np.full(per_datum, 7, np.int64)),
            loss_fn_inputs={
                "target_tokens": np.full(per_datum, 8, np.int64),
                "weights": np.ones(per_datum, np.float32),
            },
        )
        for _ in range(200)
    ]
    assert sum(estimate_datum_bytes(d) for d in big[:100]) == 40_000_000
    with LocalServer(client_config=config, long_poll_s=2.0) as server:
        services = [
            tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) for _ in range(2)
        ]
        try:
            trainings = [s.create_lora_training_client("base", rank=4) for s in services]
            barrier = threading.Barrier(2)
            futures: list[list[concurrent.futures.Future]] = [[], []]

            def run(i: int) -> None:
                barrier.wait(HANG)
                futures[i].append(trainings[i].forward_backward(big, "cross_entropy"))
                futures[i].append(trainings[i].optim_step(types.AdamParams()))

            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(HANG)
            flat = [f for fs in futures for f in fs]
            done, not_done = concurrent.futures.wait(flat, timeout=HANG * 4)
            assert not not_done
            for fs in futures:
                assert len(fs[0].result().loss_fn_outputs) == 200
                assert len(fs[0].request_ids) == 2
            limiter = services[0]._session.limiter
            assert limiter is services[1]._session.limiter  # same (url, key): one budget
            assert limiter.snapshot()["fwdbwd_bytes"] == 50_000_000
        finally:
            for s in services:
                s.close()


def test_close_waits_for_the_sender_thread_of_an_op_in_flight(server):
    """close() returns only once the client's sender thread has exited, even with a send in
    flight: here one inside its HTTP backoff (the soak test's "no per-client thread survives
    close()", made deterministic)."""
    backing_off = threading.Event()

    def hook(event) -> None:
        if event.kind == "retry_scheduled" and event["path"].endswith("/forward_backward"):
            backing_off.set()  # runs on the sender thread, right before its backoff sleep

    service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key, hooks=[hook])
    training = service.create_lora_training_client("base", rank=4)
    server.faults.add("forward_backward 503 x1")
    fwd = training.forward_backward([datum()], "cross_entropy")
    assert backing_off.wait(HANG)
    service.close()
    # alive: a Thread whose start() a signal handler cut short may linger in the list, unstarted
    senders = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("tinker_sync-sender-") and t.is_alive()
    ]
    assert senders == []
    assert isinstance(fwd.exception(0), tinker_sync.ClientClosedError)
    assert [r.status for r in server.requests.filter(endpoint="forward_backward")] == [503]
