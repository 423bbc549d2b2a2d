"""Futures: retrieve_future long polls, the retrieve_futures session poller, cancels.

Usage (the app builds one and routes requests to it)::

    api = FutureApi(app)
    response = await api.retrieve_future(request)

Every handler reads and writes the state of the one :class:`~tinker_sync.local._app.TinkerApp`
it serves (``self.app``), on the app's event loop.

Thread safety: event-loop only, like the app. Fork safety: not fork-safe.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tinker_sync._wire._headers import ADVERT_HEADER, HOLD_HEADER
from tinker_sync.local._body import (
    Body,
    HttpError,
    json_body,
)
from tinker_sync.local._httpapi import HttpRequest, HttpResponse
from tinker_sync.local._state import (
    PROTO_KINDS,
    FutureRecord,
)

if TYPE_CHECKING:
    from tinker_sync.local._app import TinkerApp

__all__ = ["FutureApi"]

#: How long a poll on a paused queue is held before answering try_again (bounded by long_poll_s).
#: A pause in the ``active`` state only stops work (slow work, as a busy server has): its polls
#: are held like any other pending future's.
_PAUSED_POLL_S = 1.0


class FutureApi:
    """The futures endpoints of one :class:`TinkerApp` (its ``self.app``)."""

    def __init__(self, app: TinkerApp) -> None:
        self.app = app

    async def _payload(self, rec: FutureRecord, form: str) -> bytes:
        blob = rec.encoded.get(form)
        if blob is None:
            result, kind, ids = rec.result, rec.kind, rec.sample_sequence_ids
            blob = await self.app._run_io(lambda: self.app._encode(kind, result, form, ids))
            rec.encoded[form] = blob
        return blob

    def _try_again(
        self, rec: FutureRecord, state: str = "active", reason: str | None = None
    ) -> HttpResponse:
        body: dict[str, Any] = {
            "type": "try_again",
            "request_id": rec.request_id,
            "queue_state": state,
        }
        if reason is not None:
            body["queue_state_reason"] = reason
        return HttpResponse.json(body)

    def _poll_hold(self, request: HttpRequest) -> float:
        """How long to hold this poll: ``long_poll_s``, or less if the client asked for less
        with ``X-Tinker-Poll-Hold`` (advertised on poll replies with ``X-Tinker-Poll-Hold-Max``)."""
        raw = request.headers.get(HOLD_HEADER.lower())
        if raw is None:
            return self.app.long_poll_s
        try:
            asked = float(raw)
        except ValueError:
            raise HttpError(400, f"{HOLD_HEADER}: expected seconds, got {raw!r}") from None
        if not asked >= 0.0:  # also NaN
            raise HttpError(400, f"{HOLD_HEADER}: expected seconds >= 0, got {raw!r}")
        return min(self.app.long_poll_s, asked)

    def advert(self) -> dict[str, str]:
        """The header telling clients which poll hold they may ask for (the current protocol
        only: an older server knows nothing of requested holds)."""
        if self.app.protocol == "legacy":
            return {}
        return {ADVERT_HEADER: f"{self.app.long_poll_s:g}"}

    async def _hold_poll(self, rec: FutureRecord, hold_s: float) -> HttpResponse | None:
        """Long-poll a pending future: None once it is done, else a try_again answer.

        Held up to ``hold_s``; while its queue is paused in a state other than ``active``, up to
        ``min(hold_s, 1 s)`` and answered with the paused state (so the client learns it
        promptly).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        kind = self.app._pause_kind(rec.kind)
        while not rec.done and not self.app._closed:
            pause = self.app._paused[kind]
            held_as_usual = pause is None or pause[0] == "active"
            limit = hold_s if held_as_usual else min(hold_s, _PAUSED_POLL_S)
            remaining = start + limit - loop.time()
            if remaining <= 0:
                state, reason = pause or ("active", None)
                return self._try_again(rec, state, reason)
            await rec.wait(remaining)
        if not rec.done:
            return self._try_again(rec)
        return None

    async def retrieve_future(self, request: HttpRequest) -> HttpResponse:
        answer = await self._retrieve_future(request)
        if answer.status < 400:
            answer.headers.update(self.advert())
        return answer

    async def _retrieve_future(self, request: HttpRequest) -> HttpResponse:
        hold_s = self._poll_hold(request)
        b = json_body(request)
        request_id = b.str_("request_id")
        allow_metadata = b.bool_("allow_metadata_only", False)
        rec = self.app._futures.get(request_id)
        fault = request.poll_fault
        if rec is None:
            if self.app._futures.is_lost(request_id):
                raise HttpError(404, f"future {request_id} not found")
            raise HttpError(410, f"future {request_id} is unknown or has expired")
        if fault is not None:
            if fault.expire:
                raise HttpError(410, f"future {request_id} has expired (injected: {fault.name})")
            if fault.queue_state is not None:
                return self._try_again(rec, fault.queue_state, fault.reason)
            if fault.fail is not None:
                message = fault.message or f"injected failure ({fault.name})"
                rec.force_fail(message, fault.fail, now=self.app._clock())
                return HttpResponse.json({"error": rec.error, "category": rec.category})
        if not rec.done:
            answer = await self._hold_poll(rec, hold_s)
            if answer is not None:
                return answer
        if rec.state == "failed":
            return HttpResponse.json({"error": rec.error, "category": rec.category})
        if rec.result is None and not rec.encoded:
            raise HttpError(410, f"future {request_id}'s result was already retrieved and released")
        want_proto = (
            rec.kind in PROTO_KINDS
            and self.app.protocol == "current"
            and "application/x-protobuf" in request.headers.get("accept", "")
        )
        form = "proto" if want_proto else "json"
        blob = await self._payload(rec, form)
        forced = fault is not None and fault.metadata_only
        if (
            allow_metadata
            and not rec.metadata_sent
            and (forced or len(blob) > self.app.metadata_threshold_bytes)
        ):
            rec.metadata_sent = True
            return HttpResponse.json(
                {
                    "status": "complete_metadata",
                    "request_id": rec.request_id,
                    "response_payload_size": len(blob),
                }
            )
        ctype = "application/x-protobuf" if want_proto else "application/json"
        return HttpResponse(200, {"content-type": ctype}, blob)

    async def retrieve_futures(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        target = Body(b.get("target"), "target")
        ttype = target.opt_str("type") or "sampling_session"
        if ttype != "sampling_session":
            raise HttpError(400, f"target.type: unsupported target {ttype!r}")
        s = self.app._sampling_api.sampler_rt(target.str_("sampling_session_id"))
        cloned = target.int_or("cloned_sampler_id", 0, minimum=0)
        prev = b.int_or("prev_cursor", 0, minimum=0)
        timeout = b.opt_num("timeout")
        acked = b.opt_str_list("retrieved_request_ids") or []
        if request.poll_fault is not None and request.poll_fault.expire:
            raise HttpError(410, f"injected: {request.poll_fault.name}")
        for rid in acked:
            rec = self.app._futures.get(rid)
            if rec is not None and rec.owner == s.sampler_id:
                self.app._futures.forget(rid)
        ch = s.channel(cloned)
        ch.ack(prev)
        ch.prune(self.app._clock() - 3600.0)
        wait_s = (
            self.app.long_poll_s
            if timeout is None
            else max(0.0, min(timeout, self.app.long_poll_s))
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            completions = ch.after(prev)
            remaining = deadline - loop.time()
            if completions or remaining <= 0 or self.app._closed:
                break
            event = ch.changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        cursor = max(prev, ch.last_cursor) if completions else prev
        return HttpResponse.json(
            {"completions": completions, "cursor": cursor}, headers=self.advert()
        )

    async def cancel_future(self, request: HttpRequest) -> HttpResponse:
        b = json_body(request)
        rec = self.app._futures.get(b.str_("request_id"))
        if rec is not None and not rec.done:
            rec.cancelled = True
            rec.fail("cancelled by the client", "user", now=self.app._clock())
        return HttpResponse.json({})
