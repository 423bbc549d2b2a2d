"""Every number the prose restates is tied to the constant it restates.

README.md, ARCHITECTURE.md, docs/*.md and the SDK's docstrings and comments repeat limits,
timeouts, backoff caps and sizes that live as constants in the code. Each :class:`Fact` below is
a phrase with the number(s) captured, and the constant(s) they restate: every occurrence of the
phrase must show the constant's current value, and each phrase must occur at least once (so a
reworded sentence is noticed and re-tied, not silently dropped). Change a constant without its
prose and this fails, naming the file and line.

docs/design/ is not scanned: it describes the protocol and the official client, whose numbers do
not change with ours.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tinker_sync import _config, _futures, checkpoints
from tinker_sync._flow import breaker, hedge, limiter, retry, sharedbackoff, sharedcircuit
from tinker_sync._polling import decide, hold, poller
from tinker_sync._runtime import executor, governor, imports
from tinker_sync._sampling import retry as job_retry
from tinker_sync._sampling.retry import RetryConfig
from tinker_sync._session import state
from tinker_sync._transport import _connection, _settings
from tinker_sync._wire import _estimates
from tinker_sync.local import _rest

ROOT = Path(__file__).resolve().parent.parent
KIB = 1024
MIB = 1024 * 1024
LEGACY_READ_S = hold.LEGACY_TIMEOUT.read or 0.0
HEALTH = _config.HealthPolicy()


@dataclass(frozen=True)
class Fact:
    """``pattern``'s groups restate ``values`` (in order); ``where`` limits the files."""

    pattern: str
    values: Sequence[float]
    where: str = ""  # a substring of the file's path relative to the repository root


FACTS: list[Fact] = [
    # the sampling limiter (docs/limiter.md)
    Fact(r"(\d[\d,]*) submissions in flight", [limiter.DISPATCH_COUNT]),
    Fact(r"\((\d+) while recently rate-limited\)", [limiter.BACKED_OFF_COUNT]),
    Fact(
        r"now < deadline \+ (\d+) s\): count gate of (\d+)",
        [limiter.RECENT_BACKOFF_S, limiter.BACKED_OFF_COUNT],
    ),
    Fact(
        r"gates are count\((\d+)\) -> count\((\d+),",
        [limiter.DISPATCH_COUNT, limiter.BACKED_OFF_COUNT],
    ),
    Fact(r"never sees more than (\d+) samples in flight", [limiter.DISPATCH_COUNT]),
    Fact(r"(\d+) MiB by default", [limiter.DEFAULT_SAMPLE_DISPATCH_BYTES / MIB]),
    Fact(
        r"charged (\d+) B/token \(×(\d+) while recently backed off\)",
        [_estimates.SAMPLE_BYTES_PER_TOKEN, limiter.BACKED_OFF_BYTE_PENALTY],
    ),
    Fact(r"penalises ×(\d+) only after a backoff", [limiter.BACKED_OFF_BYTE_PENALTY]),
    Fact(r"`STOP_RECHECK_S` \((\d+) s\)", [limiter.STOP_RECHECK_S]),
    Fact(r"stalled head at most (\d+) s plus one pump", [limiter.STOP_RECHECK_S]),
    Fact(r"after a wake or (\d+) s \(\[above\]", [limiter.STOP_RECHECK_S]),
    Fact(
        r"Retry-After if in \(0, (\d+)\] s, else (\d+) s \(prompt ≤ (\d+) KiB\) or (\d+) s",
        [
            retry.RETRY_AFTER_MAX,
            limiter.RATE_LIMIT_BACKOFF_S,
            limiter.LARGE_PROMPT_BYTES / KIB,
            limiter.LARGE_PROMPT_BACKOFF_S,
        ],
    ),
    Fact(r"also moves the deadline by (\d+) s", [limiter.PAUSED_QUEUE_BACKOFF_S]),
    Fact(r"more than (\d+) s (?:beyond it|ahead)", [sharedbackoff.MAX_SHARED_WAIT_S]),
    Fact(r"(\d+)-byte record", [sharedbackoff.RECORD_SIZE]),
    Fact(r"record is (\d+) bytes", [sharedbackoff.RECORD_SIZE]),
    Fact(r"(\d+)-byte circuit record", [sharedcircuit.RECORD_SIZE]),
    Fact(r"reason \(UTF-8, truncated to (\d+) bytes\)", [sharedcircuit.REASON_BYTES]),
    Fact(r"`SHARED_CHECK_S` \(([\d.]+) s, real time\)", [breaker.SHARED_CHECK_S]),
    Fact(r"`SHARED_CHECK_IDLE_S` \((\d+) s\)", [breaker.SHARED_CHECK_IDLE_S]),
    Fact(
        r"HELD again after min\(2\^n, (\d+)\) s on the timer \((\d+) s budget\)",
        [retry.HOLDER_MAX_WAIT, retry.HOLDER_BUDGET_S],
    ),
    Fact(r"pool width \((\d+) by default\)", [executor.DEFAULT_SIZES["sample-submit"]]),
    # the latency-driven send width (docs/limiter.md#send-width)
    Fact(
        r"knows (\d+) of the last (\d+), takes",
        [limiter.SEND_LATENCY_MIN_SAMPLES, limiter.SEND_LATENCY_WINDOW],
    ),
    Fact(r"`m` ≤ (\d+) ms", [limiter.WIDEN_ABOVE_S * 1000]),
    Fact(r"`m` > (\d+) ms", [limiter.WIDEN_ABOVE_S * 1000]),
    Fact(
        r"⌈8 × m / ([\d.]+) s⌉, at most (\d+)",
        [limiter.SEND_TARGET_S, limiter.MAX_SEND_WIDTH],
    ),
    Fact(r"more than ([\d.]+) of a core", [limiter.BUSY_CPU_SHARE]),
    Fact(r"exchanges older than (\d+) s are forgotten", [limiter.SEND_LATENCY_MAX_AGE_S]),
    Fact(r"Widened up to (\d+) while exchanges are slow", [limiter.MAX_SEND_WIDTH]),
    # HTTP retries and the submission loop (docs/guarantees.md, _flow/retry.py)
    Fact(
        r"`max_retries` retries \(default (\d+)\) at ([\d.]+), 1, 2 … (\d+) s",
        [_config.DEFAULT_MAX_RETRIES, retry.INITIAL_RETRY_DELAY, retry.MAX_RETRY_DELAY],
    ),
    Fact(r"``max_retries`` \((\d+)\)", [_config.DEFAULT_MAX_RETRIES]),
    Fact(
        r"min\(([\d.]+) ?\*(?: ?2\^k|2\^k| 2\*\*k), (\d+)\)",
        [retry.INITIAL_RETRY_DELAY, retry.MAX_RETRY_DELAY],
        where="tinker_sync/",
    ),
    Fact(r"when in \(0, (\d+)\] s", [retry.RETRY_AFTER_MAX]),
    Fact(r"since the first attempt \(default (\d+) s\)", [_config.DEFAULT_TIMEOUT]),
    Fact(
        r"connecting / reading \| (\d+) s / (\d+) s",
        [_config.DEFAULT_CONNECT_TIMEOUT, _config.DEFAULT_TIMEOUT],
    ),
    Fact(r"min\(2\^n, (\d+)\)", [retry.HOLDER_MAX_WAIT], where="guarantees.md"),
    Fact(
        r"`MAIN_WAIT_SLICE_S` \(([\d.]+) s\)", [_futures.MAIN_WAIT_SLICE_S], where="guarantees.md"
    ),
    Fact(r"`IMPORT_ATTEMPTS` \((\d+)\)", [imports.IMPORT_ATTEMPTS], where="guarantees.md"),
    # the background share (docs/scale-out.md#background-share)
    Fact(
        r"used at least (\d+) % of the last\s+(\d+) ms\)",
        [governor.BUSY * 100, governor.PERIOD_S * 1000],
        where="scale-out.md",
    ),
    Fact(r"at most (\d+) ms per decision", [governor.MAX_PAUSE_S * 1000], where="scale-out.md"),
    Fact(r"default share of ([\d.]+) your", [governor.DEFAULT_SHARE], where="scale-out.md"),
    Fact(r"min\(2\^n, (\d+)\)", [retry.HOLDER_MAX_WAIT], where="tinker_sync/_flow/"),
    Fact(r"total stays within (\d+) s", [retry.HOLDER_BUDGET_S]),
    Fact(r"a 402 pauses (\d+) s at a time", [retry.BILLING_PAUSE_S]),
    Fact(r"younger than the window \((\d+) s\)", [retry.DEFAULT_BILLING_WINDOW_S]),
    Fact(
        r"billing_exception_max_pause_duration_sec` \(([\d,]+) s\)",
        [retry.DEFAULT_BILLING_WINDOW_S],
    ),
    # polling (docs/polling.md)
    Fact(r"hold \+ (\d+) s \((\d+) s\)", [hold.MARGIN_S, hold.MIN_HOLD_S + hold.MARGIN_S]),
    Fact(r"at most (\d+) polls", [hold.FEW_POLLS]),
    Fact(r"[<>]=? (\d+) polls in flight", [hold.FEW_POLLS]),
    Fact(r"min\((\d+) s, <s>\)", [hold.MIN_HOLD_S]),
    Fact(r"hold min\((\d+), max\)", [hold.MIN_HOLD_S]),
    Fact(r"(?:reads with that|read =?) ?hold \+ (\d+) s", [hold.MARGIN_S]),
    Fact(r"long before the (\d+) s read timeout", [LEGACY_READ_S]),
    Fact(r"own hold, a (\d+) s read timeout", [LEGACY_READ_S]),
    Fact(r"else (\d+) s; then re-polled", [LEGACY_READ_S]),
    Fact(r"server's hold, read (\d+) s", [LEGACY_READ_S]),
    Fact(r"LEGACY_TIMEOUT` \((\d+) s\)", [LEGACY_READ_S]),
    Fact(r"re-polled after [\d.]+-(\d+) s", [decide.LOST_REPLY_MAX_S]),
    Fact(r"(\d+) re-polls for a 400", [decide.MAX_BAD_400]),
    Fact(r"\| 400 \| at once, at most (\d+) times", [decide.MAX_BAD_400]),
    Fact(r"`try_again` after ≥ (\d+) s", [decide.FAST_TRY_AGAIN_S]),
    Fact(
        r"`try_again` faster than (\d+) s \(m-th in a row\) \| `min\(0\.05·2\^m, (\d+)\)` s",
        [decide.FAST_TRY_AGAIN_S, decide.FAST_TRY_AGAIN_S],
    ),
    Fact(r"5xx \(n-th in a row\) \| `min\(0\.1·2\^n, (\d+)\)` s", [decide.SERVER_ERROR_MAX_S]),
    Fact(r"shared\) \| `min\(2\^n, (\d+)\)` s", [decide.BACKOFF_MAX_S]),
    Fact(r"m-th in a row\) \| `min\(0\.1·2\^m, (\d+)\)` s", [decide.LOST_REPLY_MAX_S]),
    Fact(r"\| 402 \| (\d+) s while inside the billing window", [decide.BILLING_PAUSE_S]),
    Fact(r"(\d+) s between failed polls", [poller.RETRYABLE_SLEEP_S]),
    # lost requests (docs/polling.md#lost-requests)
    Fact(r"`LOST_PROBE_AFTER_S` = (\d+) s", [poller.LOST_PROBE_AFTER_S]),
    Fact(r"`LOST_PROBE_SPACING_S` = ([\d.]+) s", [poller.LOST_PROBE_SPACING_S]),
    Fact(r"LOST_RESUBMITS = (\d+)", [job_retry.LOST_RESUBMITS]),
    Fact(r"waited (\d+) s since it was accepted or last probed", [poller.LOST_PROBE_AFTER_S]),
    Fact(r"resubmits it under a new seq_id at most (\d+) times", [job_retry.LOST_RESUBMITS]),
    Fact(r"a failed attempt in the last (\d+) s", [hedge.LOSSY_WINDOW_S]),
    Fact(r"(\d+) × the 90th percentile", [hedge.FACTOR]),
    Fact(r"at least ([\d.]+) s, and only if", [hedge.MIN_DELAY_S]),
    Fact(r"none until (\d+) latencies", [hedge.MIN_SAMPLES]),
    Fact(r"hedged after (\d+) s meanwhile, `COLD_DELAY_S`", [hedge.COLD_DELAY_S]),
    Fact(r"up to (\d+) copies per attempt \(`MAX_HEDGES`", [hedge.MAX_HEDGES]),
    Fact(r"reads for at most (\d+) s\s+\(`COPY_READ_S`", [hedge.COPY_READ_S]),
    # docs/limiter.md#who-reacts: who reacts to a 429, a 5xx or a connection error
    Fact(r"`min\(0\.5·2\^k, (\d+)\)` s", [retry.MAX_RETRY_DELAY]),
    Fact(r"up to `max_retries` \((\d+)\)", [_config.DEFAULT_MAX_RETRIES]),
    Fact(r"once `timeout` \((\d+) s\) has passed", [_config.DEFAULT_TIMEOUT]),
    Fact(
        r"retried after `min\(2\^n, (\d+)\)` s within (\d+) s",
        [retry.HOLDER_MAX_WAIT, retry.HOLDER_BUDGET_S],
    ),
    Fact(r"`stall_timeout` \((\d+) s\)", [_config.DEFAULT_STALL_TIMEOUT]),
    Fact(
        r"d = Retry-After in \(0, (\d+)\] s, else (\d+) s \(prompt ≤ (\d+) KiB\) or (\d+) s",
        [
            retry.RETRY_AFTER_MAX,
            limiter.RATE_LIMIT_BACKOFF_S,
            limiter.LARGE_PROMPT_BYTES / KIB,
            limiter.LARGE_PROMPT_BACKOFF_S,
        ],
    ),
    Fact(
        r"for (\d+) s after it the count gate is (\d+) and bytes cost ×(\d+)",
        [limiter.RECENT_BACKOFF_S, limiter.BACKED_OFF_COUNT, limiter.BACKED_OFF_BYTE_PENALTY],
    ),
    Fact(r"lossy for `_flow/hedge` for (\d+) s", [hedge.LOSSY_WINDOW_S]),
    Fact(
        r"`min\(0\.5·2\^a, (\d+)\)` s ± (\d+) %",
        [RetryConfig().retry_delay_max, RetryConfig().jitter_factor * 100],
    ),
    Fact(r"`SamplingStuckError` after ([\d,]+) s", [RetryConfig().progress_timeout]),
    Fact(r"`min\(2\^n, (\d+)\)` s \(counter shared", [decide.BACKOFF_MAX_S]),
    Fact(r"connect timeout: `min\(2\^n, (\d+)\)` s", [decide.BACKOFF_MAX_S]),
    Fact(r"`min\(0\.1·2\^n, (\d+)\)` s × U", [decide.SERVER_ERROR_MAX_S]),
    Fact(r"`min\(0\.1·2\^m, (\d+)\)` s × U", [decide.LOST_REPLY_MAX_S]),
    Fact(r"moves the limiter's deadline by (\d+) s", [limiter.PAUSED_QUEUE_BACKOFF_S]),
    Fact(r"\| (\d+) s, then poll again", [poller.RETRYABLE_SLEEP_S]),
    Fact(
        r"Timeout\((\d+), connect=(\d+)\), max_retries=(\d+),\s+stall_timeout=(\d+),",
        [
            _config.DEFAULT_TIMEOUT,
            _config.DEFAULT_CONNECT_TIMEOUT,
            _config.DEFAULT_MAX_RETRIES,
            _config.DEFAULT_STALL_TIMEOUT,
        ],
    ),
    # sessions, sampling retries, threads, sockets
    Fact(r"`close\(\)` \| (\d+) s for the background threads", [state.CLOSE_JOIN_TIMEOUT_S]),
    Fact(r"(\d+) s close bound", [state.CLOSE_JOIN_TIMEOUT_S]),
    Fact(
        r"at most (\d+) close attempts within a (\d+) s close budget",
        [state.CLOSE_ATTEMPTS, state.CLOSE_BUDGET_S],
    ),
    Fact(r"after (\d+) s of failed heartbeats", [state.HEARTBEAT_WARN_AFTER_S]),
    Fact(r"without any completed sample \(([\d,]+) s\)", [RetryConfig().progress_timeout]),
    Fact(r"(?:exit|leave) after (\d+) s idle", [executor._IDLE_EXIT_S]),
    Fact(
        r"keepalive \((\d+) s idle, (\d+) s between probes, (\d+) probes\)",
        [_settings.KEEPALIVE_IDLE_S, _settings.KEEPALIVE_INTERVAL_S, _settings.KEEPALIVE_COUNT],
    ),
    Fact(r"a body of up to (\d+) KiB", [_connection.COALESCE_LIMIT / KIB]),
    # checkpoint downloads (docs/downloads.md)
    Fact(
        r"\((\d+) s when absent; between ([\d.]+) and\s+(\d+) s\)",
        [
            checkpoints.ARCHIVE_POLL_S,
            checkpoints.ARCHIVE_POLL_MIN_S,
            checkpoints.ARCHIVE_POLL_MAX_S,
        ],
    ),
    Fact(r"`ARCHIVE_DEADLINE_S` = (\d+) s", [checkpoints.ARCHIVE_DEADLINE_S]),
    Fact(r"DOWNLOAD_ATTEMPTS \((\d+)\)", [checkpoints.DOWNLOAD_ATTEMPTS]),
    Fact(r"RESIGN_LIMIT \((\d+)\)", [checkpoints.RESIGN_LIMIT]),
    Fact(r"`ARCHIVES_HELD` \((\d+)\)", [_rest.ARCHIVES_HELD]),
    Fact(
        r"min\(([\d.]+) \* 2\^k, (\d+)\) s less up to",
        [retry.INITIAL_RETRY_DELAY, retry.MAX_RETRY_DELAY],
    ),
    # the tenant's circuit breaker, retry budget and backoff (docs/health.md): HealthPolicy
    *[
        Fact(rf"`{knob}` \((\d[\d.]*)(?: s)?\)", [getattr(HEALTH, knob)], where="health.md")
        for knob in (
            "retry_capacity",
            "retry_cost",
            "timeout_retry_cost",
            "success_refund",
            "same_error_repeats",
            "summary_every_s",
            "http_backoff_initial_s",
            "submit_backoff_initial_s",
        )
    ],
    *[
        Fact(rf"\b{knob} \((\d[\d.]*)(?: s)?\)", [getattr(HEALTH, knob)], where="health.md")
        for knob in ("open_after", "open_after_distinct", "failure_window_s", "probe_lease_s")
    ],
    Fact(
        r"\| (\d+) s / (\d+) / (\d+) \|",
        [HEALTH.failure_window_s, HEALTH.open_after, HEALTH.open_after_distinct],
        where="health.md",
    ),
    Fact(
        r"\| ([\d.]+) s / (\d+) s / ([\d.]+) / (\d+) s \|",
        [HEALTH.probe_initial_s, HEALTH.probe_max_s, HEALTH.probe_jitter, HEALTH.probe_lease_s],
        where="health.md",
    ),
    Fact(
        r"\| (\d+) / (\d+) / (\d+) / (\d+) \|",
        [
            HEALTH.retry_capacity,
            HEALTH.retry_cost,
            HEALTH.timeout_retry_cost,
            HEALTH.success_refund,
        ],
        where="health.md",
    ),
    Fact(r"\| `same_error_repeats` \| (\d+) \|", [HEALTH.same_error_repeats], where="health.md"),
    Fact(r"\| `summary_every_s` \| (\d+) s \|", [HEALTH.summary_every_s], where="health.md"),
    Fact(r"\| `paused_polls_per_s` \| (\d+) \|", [HEALTH.paused_polls_per_s], where="health.md"),
    Fact(
        r"at most `paused_polls_per_s` \((\d+)\) a\s+second",
        [HEALTH.paused_polls_per_s],
        where="health.md",
    ),
    Fact(
        r"until\s+`1 / paused_polls_per_s` \(([\d.]+) s\)",
        [1 / HEALTH.paused_polls_per_s],
        where="health.md",
    ),
    Fact(
        r"min\(([\d.]+) s \* 2\^n, (\d+) s\) \*\s+\(1 - ([\d.]+) r\)",
        [HEALTH.probe_initial_s, HEALTH.probe_max_s, HEALTH.probe_jitter],
        where="health.md",
    ),
    Fact(
        r"\| ([\d.]+) s / (\d+) s / ([\d.]+) \|$",
        [HEALTH.http_backoff_initial_s, HEALTH.http_backoff_max_s, HEALTH.http_backoff_jitter],
        where="health.md",
    ),
    Fact(
        r"\| (\d+) s / (\d+) s \|$",
        [HEALTH.submit_backoff_initial_s, HEALTH.submit_backoff_max_s],
        where="health.md",
    ),
    Fact(
        r"min\(([\d.]+) s \* 2\^k, (\d+) s\) \* \(1 - ([\d.]+) r\)",
        [HEALTH.http_backoff_initial_s, HEALTH.http_backoff_max_s, HEALTH.http_backoff_jitter],
        where="health.md",
    ),
    Fact(
        r"`min\((\d+) s \* 2\^n, (\d+) s\)`",
        [HEALTH.submit_backoff_initial_s, HEALTH.submit_backoff_max_s],
        where="health.md",
    ),
]


def _texts() -> list[tuple[str, str]]:
    paths = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    sdk = ROOT / "tinker_sync"
    paths += sorted(p for p in sdk.rglob("*.py") if "local" not in p.relative_to(sdk).parts)
    return [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in paths]


TEXTS = _texts()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("fact", FACTS, ids=lambda fact: fact.pattern[:40])
def test_prose_restates_the_constant(fact: Fact) -> None:
    found = 0
    wrong: list[str] = []
    regex = re.compile(fact.pattern, re.MULTILINE)
    for name, text in TEXTS:
        if fact.where not in name:
            continue
        for match in regex.finditer(text):
            found += 1
            if [_number(g) for g in match.groups()] != [float(v) for v in fact.values]:
                line = text.count("\n", 0, match.start()) + 1
                wrong.append(f"{name}:{line}: {match.group(0)!r} should say {list(fact.values)}")
    assert found, f"no text says {fact.pattern!r} any more: re-tie the fact to the new wording"
    assert not wrong, "prose out of date with the code:\n" + "\n".join(wrong)


def test_a_changed_constant_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is live: with the count gate at 401 the prose about 400 is reported."""
    fact = Fact(r"(\d[\d,]*) submissions in flight", [limiter.DISPATCH_COUNT + 1])
    with pytest.raises(AssertionError, match="submissions in flight"):
        test_prose_restates_the_constant(fact)
