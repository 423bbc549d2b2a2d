"""Scriptable fault injection for the local server (docs/design/local-server.md#fault-format).

Usage::

    from tinker_sync.local import Fault, FaultPlan

    plan = FaultPlan(["asample 429 x2 retry_after=0.5", {"endpoint": "optim_step", "drop": "before"}])
    rule = plan.add(Fault(endpoint="retrieve_future", fail="user", match={"request_type": "Sample"}))
    ...                                  # run the client against a server using ``plan``
    assert rule.hits == 1
    plan.assert_exhausted()

A plan is an ordered list of rules. For each request the first matching rule with budget left
applies: a rule with an *action* (``status``, ``drop``, ``queue_state``, ``fail``, ``expire``,
``metadata_only``, ``cut_at``, ``lose``) answers instead of the real handler; a rule without one (only
``delay`` / ``headers`` / ``retry_after*`` / ``should_retry`` / the download modifiers
``generating``, ``url_ttl``, ``no_ranges``) applies its effect and evaluation continues.

Compact strings: ``"<endpoint>[@METHOD] [<action>] [x<N>|x*] [key=value ...]"`` where the action
is an HTTP status, ``drop-before`` / ``drop-after``, ``paused_rate_limit`` / ``paused_capacity``
(/ ``active``), ``fail:<category>``, ``expire``, ``metadata`` or ``lose``. Values may be quoted (a quoted
value is always a string); unquoted values are read as JSON-ish scalars (``true``, ``3``,
``0.5``, ``null``, ``{...}``). ``match.<field>=v`` fills ``match``; ``headers.<name>=v`` fills
``headers``.

Selection: ``after=N`` lets the first N matches through; ``every=K`` then applies the rule only
to every K-th remaining match (the K-th, 2K-th, ...; default 1 = each one), which gives a
deterministic rate, e.g. ``"asample 503 x* every=20"`` fails 5 % of the sample submissions;
``times`` counts applications, not matches.

Endpoint globs: the pattern is matched against the path after ``/api/v1/`` (``*`` matches
inside one segment, ``**`` across segments); a pattern starting with ``/`` is matched against
the whole path; ``*`` alone matches every request.

Thread safety: :class:`Fault` is immutable; :class:`FaultPlan` is guarded by a lock and may be
used from any thread. Fork safety: plain data, but a forked child gets an independent copy.
"""

from __future__ import annotations

import dataclasses
import email.utils
import functools
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from tinker_sync.local._httpapi import QUEUE_STATES, HttpResponse, PollFault

__all__ = [
    "Fault",
    "FaultDecision",
    "FaultPlan",
    "FaultRule",
    "FaultSpec",
    "compile_glob",
    "parse_fault",
]

_FAIL_CATEGORIES = ("user", "server", "unknown")
_DROP_MODES = ("before", "after")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def _fmt_seconds(value: float) -> str:
    """Format a seconds / milliseconds value for a header: ``2`` not ``2.0``, ``0.5`` kept."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


@dataclass(frozen=True)
class Fault:
    """One fault rule (all keys of docs/design/local-server.md#fault-format).

    Usage: ``Fault(endpoint="asample", status=429, times=2, retry_after=0.5)``.

    ``times=None`` affects every match; ``after=N`` lets the first N matches through;
    ``every=K`` applies the rule only to every K-th match after those (a deterministic rate:
    ``every=20`` is 5 %); ``times`` counts applications. ``body`` is
    sent as JSON, except a ``str`` which is sent verbatim as ``text/plain``. ``reason`` goes with
    ``queue_state`` and ``message`` with ``fail``. ``name`` defaults to a short description such
    as ``"asample 429"``.
    """

    endpoint: str
    method: str | None = None
    match: Mapping[str, Any] = field(default_factory=dict)
    times: int | None = 1
    after: int = 0
    every: int = 1
    name: str = ""
    delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    status: int | None = None
    body: Any = None
    empty_body: bool = False
    retry_after: float | str | None = None
    retry_after_ms: float | None = None
    retry_after_date: float | None = None
    should_retry: bool | None = None
    drop: Literal["before", "after"] | None = None
    queue_state: str | None = None
    reason: str | None = None
    fail: str | None = None
    message: str | None = None
    expire: bool = False
    metadata_only: bool = False
    lose: bool = False
    cut_at: int | None = None
    generating: float | None = None
    url_ttl: float | None = None
    no_ranges: bool = False

    def __post_init__(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"invalid fault rule for endpoint {self.endpoint!r}: {msg}")

        if not isinstance(self.endpoint, str) or not self.endpoint.strip():
            raise ValueError("a fault rule needs a non-empty 'endpoint'")
        object.__setattr__(self, "endpoint", self.endpoint.strip())
        if self.method is not None:
            if not isinstance(self.method, str) or not _HEADER_NAME.match(self.method):
                raise bad(f"bad method {self.method!r}")
            object.__setattr__(self, "method", self.method.upper())
        if self.times is not None and (
            isinstance(self.times, bool) or not isinstance(self.times, int) or self.times < 0
        ):
            raise bad(f"'times' must be a non-negative int or None, got {self.times!r}")
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise bad(f"'after' must be a non-negative int, got {self.after!r}")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise bad(f"'every' must be a positive int, got {self.every!r}")
        if isinstance(self.delay, bool) or not isinstance(self.delay, (int, float)):
            raise bad(f"'delay' must be a number, got {self.delay!r}")
        if self.delay < 0 or math.isnan(self.delay):
            raise bad("'delay' must be >= 0")
        if not isinstance(self.match, Mapping):
            raise bad("'match' must be a mapping")
        object.__setattr__(self, "match", dict(self.match))
        if not isinstance(self.headers, Mapping):
            raise bad("'headers' must be a mapping")
        headers: dict[str, str] = {}
        for k, v in self.headers.items():
            if not isinstance(k, str) or not _HEADER_NAME.match(k):
                raise bad(f"bad header name {k!r}")
            headers[k] = _header_value(v)
        object.__setattr__(self, "headers", headers)
        if self.status is not None and (
            isinstance(self.status, bool)
            or not isinstance(self.status, int)
            or not 100 <= self.status <= 599
        ):
            raise bad(f"'status' must be an HTTP status code, got {self.status!r}")
        if self.drop is not None and self.drop not in _DROP_MODES:
            raise bad(f"'drop' must be 'before' or 'after', got {self.drop!r}")
        if self.queue_state is not None and self.queue_state not in QUEUE_STATES:
            raise bad(f"'queue_state' must be one of {QUEUE_STATES}, got {self.queue_state!r}")
        if self.fail is not None and self.fail not in _FAIL_CATEGORIES:
            raise bad(f"'fail' must be one of {_FAIL_CATEGORIES}, got {self.fail!r}")
        for key in ("retry_after_ms", "retry_after_date"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise bad(f"{key!r} must be a number, got {value!r}")
        if self.retry_after is not None and (
            isinstance(self.retry_after, bool)
            or not isinstance(self.retry_after, (int, float, str))
        ):
            raise bad(f"'retry_after' must be a number or a string, got {self.retry_after!r}")
        if self.cut_at is not None and (
            isinstance(self.cut_at, bool) or not isinstance(self.cut_at, int) or self.cut_at < 0
        ):
            raise bad(f"'cut_at' must be a non-negative int, got {self.cut_at!r}")
        for key in ("generating", "url_ttl"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or math.isinf(value)
            ):
                raise bad(f"{key!r} must be a finite number >= 0, got {value!r}")
        actions = self._actions()
        if len(actions) > 1:
            raise bad(f"at most one action per rule, got {', '.join(actions)}")
        if (self.empty_body or self.body is not None) and self.status is None:
            raise bad("'body' / 'empty_body' need a 'status'")
        if self.empty_body and self.body is not None:
            raise bad("'body' and 'empty_body' are exclusive")
        if self.reason is not None and self.queue_state is None:
            raise bad("'reason' needs a 'queue_state'")
        if self.message is not None and self.fail is None:
            raise bad("'message' needs 'fail'")
        if not self.name:
            object.__setattr__(self, "name", self._auto_name())
        compile_glob(self.endpoint)  # validate early; cached

    # -- description -------------------------------------------------------------------------

    def _actions(self) -> list[str]:
        out = []
        if self.status is not None:
            out.append(str(self.status))
        if self.drop is not None:
            out.append(f"drop-{self.drop}")
        if self.queue_state is not None:
            out.append(self.queue_state)
        if self.fail is not None:
            out.append(f"fail:{self.fail}")
        if self.expire:
            out.append("expire")
        if self.metadata_only:
            out.append("metadata")
        if self.lose:
            out.append("lose")
        if self.cut_at is not None:
            out.append(f"cut@{self.cut_at}")
        return out

    @property
    def action(self) -> str | None:
        """The action token (``"429"``, ``"drop-after"``, ``"fail:user"``...), or None."""
        actions = self._actions()
        return actions[0] if actions else None

    @property
    def is_poll_action(self) -> bool:
        """True when the action is carried out by the app (queue state, fail, expire, metadata,
        lose)."""
        return bool(self.queue_state or self.fail or self.expire or self.metadata_only or self.lose)

    def _auto_name(self) -> str:
        head = self.endpoint + (f"@{self.method}" if self.method else "")
        action = self.action
        if action is None:
            parts = []
            if self.delay:
                parts.append(f"delay={_fmt_seconds(self.delay)}")
            if self.headers or self._retry_headers_static():
                parts.append("headers")
            parts.extend(f"{k}={_fmt_seconds(v)}" for k, v in self.app_params().items())
            if self.no_ranges:
                parts.append("no_ranges")
            action = " ".join(parts) or "noop"
        return f"{head} {action}"

    def app_params(self) -> dict[str, float]:
        """The download modifiers with a value handed to the app in ``request.meta``."""
        out: dict[str, float] = {}
        if self.generating is not None:
            out["generating"] = float(self.generating)
        if self.url_ttl is not None:
            out["url_ttl"] = float(self.url_ttl)
        return out

    def _retry_headers_static(self) -> bool:
        return any(
            v is not None
            for v in (
                self.retry_after,
                self.retry_after_ms,
                self.retry_after_date,
                self.should_retry,
            )
        )

    # -- conversion --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The rule as a JSON-able dict of its non-default keys (``endpoint`` and ``name`` always)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default: Any = (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            )
            if f.name in ("endpoint", "name") or value != default:
                out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        """Build a rule from a dict with the keys of docs/design/local-server.md#fault-format
        (unknown keys are errors)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a fault rule dict must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fault rule key(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(data)
        if kwargs.get("times") in ("*", "x*"):
            kwargs["times"] = None
        if kwargs.get("name") is None:
            kwargs.pop("name", None)
        return cls(**kwargs)

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """Parse the compact string form, e.g. ``'asample 429 x2 retry_after=0.5'``."""
        return _parse_compact(spec)

    # -- effects -----------------------------------------------------------------------------

    def response_headers(self, now: float | None = None) -> dict[str, str]:
        """Headers this rule adds to the response (``headers`` plus the retry-after family)."""
        out = dict(self.headers)
        if self.retry_after is not None:
            out["retry-after"] = (
                self.retry_after
                if isinstance(self.retry_after, str)
                else _fmt_seconds(self.retry_after)
            )
        if self.retry_after_ms is not None:
            out["retry-after-ms"] = _fmt_seconds(self.retry_after_ms)
        if self.retry_after_date is not None:
            when = (time.time() if now is None else now) + float(self.retry_after_date)
            out["retry-after"] = email.utils.formatdate(math.ceil(when), usegmt=True)
        if self.should_retry is not None:
            out["x-should-retry"] = "true" if self.should_retry else "false"
        return out

    def status_response(self, now: float | None = None) -> HttpResponse:
        """The reply of a ``status`` action (requires ``status``)."""
        if self.status is None:
            raise ValueError(f"fault {self.name!r} has no status")
        headers = self.response_headers(now)
        if self.empty_body:
            return HttpResponse(self.status, headers, b"")
        if isinstance(self.body, str):
            headers.setdefault("content-type", "text/plain; charset=utf-8")
            return HttpResponse(self.status, headers, self.body.encode())
        body = self.body if self.body is not None else {"detail": f"injected fault: {self.name}"}
        return HttpResponse.json(body, self.status, headers)

    def poll_fault(self) -> PollFault:
        """The :class:`PollFault` handed to the app for a poll action."""
        return PollFault(
            name=self.name,
            queue_state=self.queue_state,
            reason=self.reason,
            fail=self.fail,
            message=self.message,
            expire=self.expire,
            metadata_only=self.metadata_only,
            lose=self.lose,
        )

    def matches(self, method: str, path: str, endpoint: str) -> bool:
        """Whether the method and path filters of this rule accept the request."""
        if self.method is not None and self.method != method.upper():
            return False
        return compile_glob(self.endpoint)(path, endpoint)


def _header_value(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = _fmt_seconds(value)
    else:
        text = str(value)
    return text.replace("\r", " ").replace("\n", " ")


# ---------------------------------------------------------------------------------------------
# globs


def _translate_glob(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("/**", i) and i + 3 == n:
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> Callable[[str, str], bool]:
    """Compile an endpoint pattern into ``matcher(full_path, endpoint) -> bool``.

    ``"*"`` (or ``"**"``) matches everything; a pattern starting with ``/`` is matched against
    the full path; any other against the endpoint (the path after ``/api/v1/``).
    """
    if pattern in ("*", "**"):
        return lambda path, endpoint: True
    full = pattern.startswith("/")
    if not any(c in pattern for c in "*?"):
        if full:
            return lambda path, endpoint: path == pattern
        return lambda path, endpoint: endpoint == pattern
    regex = re.compile(_translate_glob(pattern), re.DOTALL)
    if full:
        return lambda path, endpoint: regex.fullmatch(path) is not None
    return lambda path, endpoint: regex.fullmatch(endpoint) is not None


def endpoint_of(path: str) -> str:
    """The endpoint name of a decoded path: the part after ``/api/v1/``, else without the ``/``."""
    if path.startswith("/api/v1/"):
        return path[8:]
    return path.lstrip("/")


# ---------------------------------------------------------------------------------------------
# compact strings

_JSON = json.JSONDecoder()
_KEY_TOKEN = re.compile(r"^([A-Za-z_][\w.:\-]*)=(.*)$", re.DOTALL)
_TIMES_TOKEN = re.compile(r"^x(\d+|\*)$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def _split_compact(spec: str) -> list[tuple[str, bool]]:
    """Split on whitespace honouring single/double quotes; returns ``(text, quoted)`` tokens."""
    tokens: list[tuple[str, bool]] = []
    buf: list[str] = []
    quoted = False
    in_token = False
    i, n = 0, len(spec)
    while i < n:
        c = spec[i]
        if c.isspace():
            if in_token:
                tokens.append(("".join(buf), quoted))
                buf, quoted, in_token = [], False, False
            i += 1
            continue
        in_token = True
        if c in "{[" and buf and "".join(buf).endswith("=") and "".join(buf).count("=") == 1:
            try:  # an unquoted JSON value: key={"a": 1}
                _, end = _JSON.raw_decode(spec, i)
            except ValueError:
                pass
            else:
                buf.append(spec[i:end])
                i = end
                continue
        if c in "\"'":
            j = spec.find(c, i + 1)
            if j < 0:
                raise ValueError(f"unterminated quote in fault spec {spec!r}")
            buf.append(spec[i + 1 : j])
            quoted = True
            i = j + 1
            continue
        if c == "\\" and i + 1 < n:
            buf.append(spec[i + 1])
            i += 2
            continue
        buf.append(c)
        i += 1
    if in_token:
        tokens.append(("".join(buf), quoted))
    return tokens


def _scalar(text: str, quoted: bool) -> Any:
    if quoted:
        return text
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    if lowered in ("null", "none"):
        return None
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Fault))


def _parse_compact(spec: str) -> Fault:
    if not isinstance(spec, str):
        raise TypeError(f"a compact fault spec must be a str, got {type(spec).__name__}")
    tokens = _split_compact(spec)
    if not tokens:
        raise ValueError("empty fault spec")
    kwargs: dict[str, Any] = {}
    match: dict[str, Any] = {}
    headers: dict[str, str] = {}
    first, _ = tokens[0]
    if "@" in first:
        endpoint, _, method = first.rpartition("@")
        kwargs["method"] = method
    else:
        endpoint = first
    kwargs["endpoint"] = endpoint

    def put(key: str, value: Any) -> None:
        if key in kwargs:
            raise ValueError(f"fault spec {spec!r} sets {key!r} twice")
        kwargs[key] = value

    for text, quoted in tokens[1:]:
        kv = _KEY_TOKEN.match(text)
        if kv is not None:
            key, raw = kv.group(1), kv.group(2)
            value = _scalar(raw, quoted)
            if key.startswith("match."):
                match[key[6:]] = value
            elif key.startswith(("headers.", "header.")):
                headers[key.partition(".")[2]] = _header_value(value)
            elif key == "times":
                put("times", None if value in ("*", "x*") else value)
            elif key in ("body", "match", "headers") and isinstance(value, str):
                try:
                    put(key, json.loads(value) if value[:1] in ("{", "[") else value)
                except ValueError:
                    put(key, value)
            elif key in _FIELD_NAMES and key not in ("endpoint",):
                put(key, value)
            else:
                raise ValueError(f"unknown key {key!r} in fault spec {spec!r}")
        elif quoted:
            raise ValueError(f"unexpected quoted token {text!r} in fault spec {spec!r}")
        elif re.fullmatch(r"\d{3}", text):
            put("status", int(text))
        elif text in ("drop-before", "drop-after"):
            put("drop", text[5:])
        elif text in QUEUE_STATES:
            put("queue_state", text)
        elif text.startswith("fail:"):
            put("fail", text[5:])
        elif text == "expire":
            put("expire", True)
        elif text in ("metadata", "metadata_only"):
            put("metadata_only", True)
        elif text == "lose":
            put("lose", True)
        elif (tm := _TIMES_TOKEN.match(text)) is not None:
            put("times", None if tm.group(1) == "*" else int(tm.group(1)))
        else:
            raise ValueError(f"unrecognised token {text!r} in fault spec {spec!r}")
    if match:
        merged = dict(kwargs.pop("match", {}) or {})
        merged.update(match)
        kwargs["match"] = merged
    if headers:
        merged_h = dict(kwargs.pop("headers", {}) or {})
        merged_h.update(headers)
        kwargs["headers"] = merged_h
    try:
        return Fault(**kwargs)
    except TypeError as exc:
        raise ValueError(f"bad fault spec {spec!r}: {exc}") from None


FaultSpec: TypeAlias = "Fault | Mapping[str, Any] | str"


def parse_fault(spec: FaultSpec) -> Fault:
    """Normalise a :class:`Fault`, a dict (JSON files) or a compact string into a Fault."""
    if isinstance(spec, Fault):
        return spec
    if isinstance(spec, str):
        return _parse_compact(spec)
    if isinstance(spec, Mapping):
        return Fault.from_dict(spec)
    raise TypeError(f"a fault spec must be a Fault, a dict or a str, got {type(spec).__name__}")


# ---------------------------------------------------------------------------------------------
# the plan

_MISSING = object()


def _norm(value: Any) -> Any:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _equal(actual: Any, expected: Any) -> bool:
    if actual is _MISSING:
        return False
    if type(actual) is type(expected) or (
        isinstance(actual, (int, float))
        and isinstance(expected, (int, float))
        and not isinstance(actual, bool)
        and not isinstance(expected, bool)
    ):
        return bool(actual == expected)
    return bool(_norm(actual) == _norm(expected))


class FaultRule:
    """A rule inside a plan with its counters: ``seen`` matches, ``hits`` applications.

    ``remaining`` is ``times - hits`` (None for unlimited rules). Read-only for users; the
    counters of a live plan's rules update as requests arrive.
    """

    __slots__ = ("fault", "hits", "seen")

    def __init__(self, fault: Fault, hits: int = 0, seen: int = 0) -> None:
        self.fault = fault
        self.hits = hits
        self.seen = seen

    @property
    def name(self) -> str:
        return self.fault.name

    @property
    def remaining(self) -> int | None:
        if self.fault.times is None:
            return None
        return max(self.fault.times - self.hits, 0)

    @property
    def exhausted(self) -> bool:
        """Finite rules: no budget left. Unlimited rules: applied at least once."""
        if self.fault.times is None:
            return self.hits > 0
        return self.hits >= self.fault.times

    def to_dict(self) -> dict[str, Any]:
        return {
            "fault": self.fault.to_dict(),
            "name": self.name,
            "hits": self.hits,
            "seen": self.seen,
            "remaining": self.remaining,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultRule:
        return cls(Fault.from_dict(data["fault"]), int(data["hits"]), int(data["seen"]))

    def __repr__(self) -> str:
        return f"<FaultRule {self.name!r} hits={self.hits} remaining={self.remaining}>"


@dataclass
class FaultDecision:
    """What the plan decided for one request: delay, extra headers and at most one action.

    ``headers`` come from the rules without an action; the action rule's own headers
    (``action.response_headers()``) are added on top when the reply is built.
    """

    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    action: Fault | None = None
    names: list[str] = field(default_factory=list)
    #: Download modifiers for the app (``generating``, ``url_ttl``, ``no_ranges``).
    meta: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str | None:
        """The label for the request log: the action rule, else the first applied rule."""
        if self.action is not None:
            return self.action.name
        return self.names[0] if self.names else None


class FaultPlan:
    """An ordered, live list of fault rules.

    Usage: ``plan = FaultPlan(["asample 429 x2"]); plan.add("optim_step drop-before")``.

    Thread safety: every method may be called from any thread (one lock). Fork safety: a forked
    child has its own copy; the server in the parent does not see it.
    """

    def __init__(self, specs: Iterable[FaultSpec] | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        if specs is not None:
            self.extend(specs)

    @classmethod
    def from_rules(cls, rules: Iterable[FaultRule]) -> FaultPlan:
        """A plan holding these rules with their counters (e.g. a snapshot of a remote plan)."""
        plan = cls()
        plan._rules = [FaultRule(r.fault, r.hits, r.seen) for r in rules]
        return plan

    def add(self, spec: FaultSpec) -> FaultRule:
        """Append one rule (a Fault, a dict or a compact string); returns the live rule."""
        rule = FaultRule(parse_fault(spec))
        with self._lock:
            self._rules.append(rule)
        return rule

    def extend(self, specs: Iterable[FaultSpec]) -> list[FaultRule]:
        """Append several rules atomically (all are validated before any is added)."""
        if isinstance(specs, (str, Mapping, Fault)):
            specs = [specs]
        rules = [FaultRule(parse_fault(s)) for s in specs]
        with self._lock:
            self._rules.extend(rules)
        return rules

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        """The rules in evaluation order (live objects: ``hits`` and ``remaining`` update)."""
        with self._lock:
            return list(self._rules)

    def assert_exhausted(self) -> None:
        """Raise AssertionError naming every rule with budget left (or never hit, if unlimited)."""
        pending = [r for r in self.rules if not r.exhausted]
        if pending:
            desc = ", ".join(
                f"{r.name!r} (hits={r.hits}, remaining={'*' if r.remaining is None else r.remaining})"
                for r in pending
            )
            raise AssertionError(f"fault rules not exhausted: {desc}")

    def __len__(self) -> int:
        with self._lock:
            return len(self._rules)

    def __iter__(self) -> Iterator[FaultRule]:
        return iter(self.rules)

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<FaultPlan {[r.name for r in self.rules]!r}>"

    def to_list(self) -> list[dict[str, Any]]:
        """The rules and counters as JSON-able dicts."""
        with self._lock:
            return [r.to_dict() for r in self._rules]

    def evaluate(
        self,
        method: str,
        path: str,
        endpoint: str,
        fields: Callable[[], Mapping[str, Any]] | None = None,
    ) -> FaultDecision | None:
        """Decide the faults for one request and consume their budget (None: untouched).

        ``fields`` lazily supplies the match fields (JSON body fields, ``header:<name>``, app
        fields); it is called at most once, outside the plan's lock.
        """
        with self._lock:
            if not self._rules:
                return None
            snapshot = list(self._rules)
        cache: list[Mapping[str, Any]] = []

        def get_fields() -> Mapping[str, Any]:
            if not cache:
                cache.append(fields() if fields is not None else {})
            return cache[0]

        candidates = []
        for rule in snapshot:
            f = rule.fault
            if not f.matches(method, path, endpoint):
                continue
            if f.match:
                flds = get_fields()
                if not all(_equal(flds.get(k, _MISSING), v) for k, v in f.match.items()):
                    continue
            candidates.append(rule)
        if not candidates:
            return None
        decision = FaultDecision()
        now = time.time()
        with self._lock:
            live = {id(r) for r in self._rules}
            for rule in candidates:
                if id(rule) not in live:
                    continue  # cleared meanwhile
                f = rule.fault
                if f.times is not None and rule.hits >= f.times:
                    continue
                rule.seen += 1
                if rule.seen <= f.after or (rule.seen - f.after) % f.every:
                    continue
                rule.hits += 1
                decision.names.append(f.name)
                decision.delay += f.delay
                decision.meta.update(f.app_params())
                if f.no_ranges:
                    decision.meta["no_ranges"] = 1.0
                if f.action is not None:
                    decision.action = f  # its headers are added when the reply is built
                    break
                decision.headers.update(f.response_headers(now))
        if not decision.names:
            return None
        return decision


def as_plan(faults: FaultPlan | Sequence[FaultSpec] | FaultSpec | None) -> FaultPlan:
    """Coerce the ``faults=`` argument of LocalServer into a plan (a plan is used as is)."""
    if isinstance(faults, FaultPlan):
        return faults
    if faults is None:
        return FaultPlan()
    if isinstance(faults, (str, Mapping, Fault)):
        return FaultPlan([faults])
    return FaultPlan(faults)
