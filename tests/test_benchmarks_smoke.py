"""benchmarks/run.py: every row runs at toy size (so the harness cannot rot), plus its pure parts.

No timing assertions: the numbers depend on the machine. The smoke run starts a subprocess
LocalServer and one worker process per SDK (about 30-60 s on two busy cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import _profile  # noqa: E402
import run  # noqa: E402

ROW_KEYS = {"id", "name", "unit", "ours", "official", "limit", "ratio", "goal", "met", "measured"}
MACHINE_KEYS = {"cpu", "cores", "python", "numpy", "os", "date"}
#: What every row says about where it was measured (so a row copied elsewhere stays honest).
MEASURED_KEYS = {"cpu", "cores", "tinker_sync", "tinker_sync_commit", "tinker", "loadavg_1min"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    pytest.importorskip("tinker", reason="the official SDK (bench extra) is the comparison")
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_smoke_run_reports_every_row_with_numbers(smoke: tuple[dict[str, Any], str]) -> None:
    document, stdout = smoke
    rows = {row["id"]: row for row in document["rows"]}
    assert list(rows) == [row.id for row in run.ROWS]
    for spec in run.ROWS:
        row = rows[spec.id]
        assert ROW_KEYS <= set(row), spec.id
        for column, _, _ in spec.sources:
            value = row[column]
            assert isinstance(value, float) and value >= 0.0, (spec.id, column, value)
            assert row["spread"][column]["n"] == 1  # --smoke: one repetition
        absent = {"ours", "official", "limit"} - {c for c, _, _ in spec.sources}
        assert all(row[c] is None for c in absent), spec.id
        if spec.judge is None:
            assert row["met"] is None
        else:
            assert isinstance(row["met"], bool), spec.id
            assert isinstance(row["ratio"], float), spec.id
        assert spec.id in stdout  # the printed table has the row
        assert MEASURED_KEYS <= set(row["measured"]), spec.id
        assert row["measured"]["tinker"] == document["machine"]["tinker"]
    assert MACHINE_KEYS <= set(document["machine"])
    assert document["errors"] == []
    assert document["mode"] == "smoke"
    assert rows["P1-U3"]["detail"]["ours_transport"] == "urllib3"
    assert rows["P8"]["spread"]["ours"]["n"] == 1  # the compiling run is apart, not counted
    assert rows["P8"]["detail"]["ours_first_run_ms"] > 0.0
    assert rows["P9"]["detail"]["ours_busy_over_idle_per_round"] > 0.0
    assert rows["P1"]["detail"]["ours_threads_at_peak"]  # the default path's worker ran too
    assert 0.0 < rows["P12-LOOP"]["ours"] and 0.0 < rows["P12-LOOP"]["official"]
    assert {"ours_loop_ms_lost_per_sample", "official_loop_ms_lost_per_sample"} <= set(
        rows["P12-LOOP"]["detail"]
    )


def test_smoke_held_rows_really_held(smoke: tuple[dict[str, Any], str]) -> None:
    """P5/P6 windows saw only pending futures (the hold outlasted the window)."""
    rows = {row["id"]: row for row in smoke[0]["rows"]}
    assert rows["P5"]["detail"]["ours_completed_early"] == 0
    assert rows["P5"]["detail"]["official_completed_early"] == 0
    assert rows["P6"]["detail"]["ours_completed_early"] == 0
    assert rows["P6"]["detail"]["ours_threads_at_peak"]  # thread names were captured


def test_row_ids_and_sizes_cover_every_bench() -> None:
    ids = [r.id for r in run.ROWS]
    assert len(set(ids)) == len(ids)
    assert {f"P{i}" for i in range(1, 9)} | {"P1T", "P7T"} <= set(ids)
    for mode, sizes in _common.SIZES.items():
        assert set(sizes) == set(run.BENCH_WORKERS), mode
        for bench, size in sizes.items():
            minimum = {"full": 5, "quick": 3, "smoke": 1}[mode]
            assert size["reps"] >= minimum, (mode, bench)


def _results(ours: list[float], official: list[float], limit: list[float]) -> dict[Any, Any]:
    return {
        ("sample", "ours"): {"samples_per_s": ours},
        ("sample", "official"): {"samples_per_s": official},
        ("sample", "raw"): {"samples_per_s": limit},
    }


def test_build_row_medians_ratio_and_verdict() -> None:
    p1 = run.ROWS[0]
    sizes = _common.SIZES["quick"]
    row = run.build_row(p1, _results([300.0, 100.0, 200.0], [50.0, 100.0, 80.0], [250.0]), sizes)
    assert row["ours"] == 200.0 and row["official"] == 80.0 and row["limit"] == 250.0
    assert row["ratio"] == pytest.approx(2.5)
    assert row["met"] is True
    assert row["spread"]["ours"]["min"] == 100.0 and row["spread"]["ours"]["max"] == 300.0
    assert row["ratio_official"] == pytest.approx(2.5) and row["ratio_limit"] == 0.8
    # ratio fine but below 0.8 x limit
    row = run.build_row(p1, _results([200.0], [80.0], [251.0]), sizes)
    assert row["met"] is False
    # a missing column gives no ratio and no verdict on the limit part
    row = run.build_row(p1, {("sample", "ours"): {"samples_per_s": [1.0]}}, sizes)
    assert row["ratio"] is None and row["official"] is None and row["met"] is False
    row = run.build_row(p1, {}, sizes)
    assert row["ours"] is None and row["met"] is None


def test_readme_markdown_comes_from_the_rows(tmp_path: Path, capsys: Any) -> None:
    p1 = run.ROWS[0]
    sizes = _common.SIZES["quick"]
    met = run.build_row(p1, _results([200.0], [80.0], [250.0]), sizes)
    missed = run.build_row(p1, _results([200.0], [80.0], [251.0]), sizes)
    table = run.format_markdown([met, missed]).splitlines()
    assert len(table) == 4 and table[0].startswith("| row |")
    assert table[2].startswith("| P1 | ") and "| 200 samples/s | 80.00 samples/s |" in table[2]
    assert table[2].endswith("✓ |") and table[3].endswith("✗ |")
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": [met]}))
    assert run.main(["--markdown", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == table[:3]


def test_the_raw_limit_mirrors_tinker_syncs_thread_counts() -> None:
    groups = {
        "tinker_sync-sample-submit": 32,
        "tinker_sync-sample-poll": 70,
        "tinker_sync-futures-poller": 1,
        "MainThread": 1,
    }
    assert run._mirror({"thread_groups_at_peak": groups}) == {"submit": 32, "poll": 70}
    assert run._mirror({"thread_groups_at_peak": {"MainThread": 1}}) is None
    assert run._mirror({}) is None


def test_p5_goal_is_per_10_s_and_compares_to_official() -> None:
    p5 = next(r for r in run.ROWS if r.id == "P5")
    sizes = _common.SIZES["quick"]
    assert sizes["held"]["window_s"] == _common.SERVER_HOLD_S  # every held poll re-sent once

    def verdict(ours: float, official: float) -> bool:
        results = {
            ("held", "ours"): {"cpu_s_per_10s": [ours]},
            ("held", "official"): {"cpu_s_per_10s": [official]},
        }
        met = run.build_row(p5, results, sizes)["met"]
        assert isinstance(met, bool)
        return met

    assert verdict(0.1, 1.0)
    assert not verdict(0.3, 1.0)  # above 0.2 x the official


def test_spread_and_percentile() -> None:
    s = _common.spread([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"], s["n"]) == (
        3.0,
        1.0,
        5.0,
        2.0,
        4.0,
        5,
    )
    assert _common.spread([7.0])["q1"] == 7.0
    assert _common.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    with pytest.raises(ValueError):
        _common.percentile([], 0.5)


def test_thread_groups_and_peak() -> None:
    assert _common.thread_group("sample-poll-12") == "sample-poll"
    assert _common.thread_group("Thread-3 (worker)") == "Thread"
    assert _common.thread_group("MainThread") == "MainThread"
    release = threading.Event()
    with _common.ThreadPeak(interval=0.001) as peak:
        threads = [threading.Thread(target=release.wait, name=f"bench-test-{i}") for i in range(3)]
        for t in threads:
            t.start()
        _common.wait_until(lambda: peak.groups.get("bench-test", 0) == 3, timeout=10)
        release.set()
        for t in threads:
            t.join()
    assert peak.peak >= 4  # main + 3
    assert "bench-thread-peak" not in peak.groups


def test_summarize_collapsed(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "run (threading.py:10);job (tinker_sync/_runtime/executor.py:5);send (tinker_sync/_transport.py:9) 6\n"
        "run (threading.py:10);job (tinker_sync/_runtime/executor.py:7);dumps (json/__init__.py:1) 3\n"
        "main (x.py:1) 1\n"
    )
    summary = _profile.summarize_collapsed(raw)
    assert summary["samples"] == 10
    assert summary["self"][0] == {
        "frame": "send (tinker_sync/_transport.py)",
        "samples": 6,
        "pct": 60.0,
    }
    inclusive = {e["frame"]: e["samples"] for e in summary["tinker_sync_inclusive"]}
    assert inclusive["job (tinker_sync/_runtime/executor.py)"] == 9  # both lines merged
    innermost = {e["frame"]: e["samples"] for e in summary["tinker_sync_innermost"]}
    assert innermost == {
        "send (tinker_sync/_transport.py)": 6,
        "job (tinker_sync/_runtime/executor.py)": 3,
    }


def test_merge_rounds_reads_like_one_process_ran_every_repetition() -> None:
    rounds = [
        {
            "p50_ms": [1.0],
            "peak_threads": 40,
            "peak_rss_mb": 60.0,
            "p90_ms_all": 2.0,
            "per_sample": {"user_cpu_s": 1.0},
            "thread_groups_at_peak": {"a": 1},
        },
        {
            "p50_ms": [3.0],
            "peak_threads": 55,
            "peak_rss_mb": 58.0,
            "p90_ms_all": 4.0,
            "per_sample": {"user_cpu_s": 3.0},
            "thread_groups_at_peak": {"b": 2},
        },
    ]
    merged = run.merge_rounds(rounds)
    assert merged["p50_ms"] == [1.0, 3.0]  # repetitions concatenate
    assert merged["peak_threads"] == 55 and merged["peak_rss_mb"] == 60.0  # peaks: the worst
    assert merged["p90_ms_all"] == [2.0, 4.0]  # other numbers: one per round (rows: median)
    assert merged["per_sample"] == {"user_cpu_s": 2.0}  # per-unit averages: averaged
    assert merged["thread_groups_at_peak"] == {"b": 2}
    assert run.merge_rounds(rounds[:1]) is rounds[0]
    assert run.INTERLEAVED <= set(run.BENCH_WORKERS)


def test_the_limit_sends_the_header_lines_tinker_sync_sends() -> None:
    """The raw limit does the same wire work: the same header names on a sample's requests
    (less the poll-hold request, a tinker_sync extension)."""
    import _worker_raw

    import tinker_sync
    from tinker_sync import types
    from tinker_sync.local import LocalServer

    endpoints = ("asample", "retrieve_future")

    def names(records: Any) -> dict[str, set[str]]:  # per endpoint, over every request
        out: dict[str, set[str]] = {e: set() for e in endpoints}
        for r in records:
            if r.endpoint in endpoints:
                out[r.endpoint] |= set(r.headers)
        return out

    with LocalServer(backend="instant") as srv:
        raw = _worker_raw.RawClient(srv.url, srv.api_key or "")
        raw.start_session()
        _worker_raw._one_sample(raw, raw.sampling_session(), 1, [1, 2, 3], 2)
        raw.pool.close()
        limit = names(srv.requests.filter())
        srv.requests.clear()
        service = tinker_sync.ServiceClient(base_url=srv.url, api_key=srv.api_key)
        sampler = service.create_sampling_client(base_model=_common.BASE_MODEL)
        prompt = types.ModelInput.from_ints([1, 2, 3])
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
        service.close()
        ours = names(srv.requests.filter())
    ours["retrieve_future"].discard("x-tinker-poll-hold")
    assert limit == ours


def test_bench_download_small_arrives_verified(tmp_path: Path) -> None:
    """bench_download.py --small: ours arrives verified within 1.1x; the official path ran."""
    pytest.importorskip("tinker", reason="the official SDK (bench extra) is the comparison")
    out = tmp_path / "p13.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_download.py"), "--small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["ours"]["outcome"] == "verified" and doc["ours"]["ratio"] <= 1.1
    assert doc["ours"]["attempts"] == doc["cuts"] + 1 == doc["ours"]["cuts_applied"] + 1
    assert doc["official"]["outcome"] and doc["official_uncut"]["outcome"] == "verified"


def test_only_writes_its_own_file_unless_out_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few rows never replace a whole run's file (results/<mode>.json)."""
    monkeypatch.setattr(run, "BENCH_DIR", tmp_path)
    monkeypatch.setattr(run, "collect", lambda *a, **k: ({}, []))
    monkeypatch.setattr(run, "_versions", lambda: {"tinker": "x", "tinker_sync": "y"})
    whole = tmp_path / "results" / "smoke.json"
    whole.parent.mkdir()
    whole.write_text("{}")
    run.main(["--smoke", "--only", "p12,P8"])
    assert whole.read_text() == "{}"
    written = json.loads((tmp_path / "results" / "only" / "smoke-P8_P12.json").read_text())
    assert [r["id"] for r in written["rows"]] == ["P8", "P12"] and written["only"] == ["P8", "P12"]
    run.main(["--smoke", "--only", "P12", "--out", str(tmp_path / "mine.json")])
    assert json.loads((tmp_path / "mine.json").read_text())["only"] == ["P12"]
    assert run.default_out("quick", None) == tmp_path / "results" / "quick.json"


def test_worker_environment_transport_and_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_SYNC_TRANSPORT", "urllib3")  # the caller's: never leaks in
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert "TINKER_SYNC_TRANSPORT" not in _common.subprocess_env("ours")
    assert "TINKER_SYNC_TRANSPORT" not in _common.subprocess_env("official")
    assert _common.subprocess_env("ours_u3")["TINKER_SYNC_TRANSPORT"] == "urllib3"
    assert run.WORKERS["ours_u3"] == run.WORKERS["ours"]
    assert _common.subprocess_env()["PYTHONDONTWRITEBYTECODE"] == "1"  # no run cache: as is
    monkeypatch.setitem(_common.BYTECODE, "prefix", "/tmp/cache")
    env = _common.subprocess_env("official")
    assert env["PYTHONPYCACHEPREFIX"] == "/tmp/cache" and "PYTHONDONTWRITEBYTECODE" not in env


def test_only_runs_the_workers_its_rows_read() -> None:
    def workers(*ids: str) -> dict[str, tuple[str, ...]]:
        return run._needed_workers([r for r in run.ROWS if r.id in ids])

    assert workers("P1") == {"sample": ("ours", "official", "raw")}
    assert workers("P2-U3") == {"sample": ("ours_u3", "official", "raw")}
    assert workers("P12", "P8") == {"gil": ("ours", "official"), "first": ()}
    every = workers(*[r.id for r in run.ROWS])
    assert every == {b: w for b, w in run.BENCH_WORKERS.items() if b in every}


def test_rows_carry_machine_versions_and_commit() -> None:
    machine = {
        "cpu": "CPU",
        "cores": 2,
        "tinker": "0.38.0",
        "tinker_sync": "0.1.0",
        "tinker_sync_commit": "abc",
        "numpy": "2",
    }
    context = run.row_context(machine, "quick")
    assert context["mode"] == "quick" and "numpy" not in context
    p12 = next(r for r in run.ROWS if r.id == "P12")
    results = {
        ("gil", "ours"): {"samples_per_s": [300.0, 310.0, 290.0]},
        ("gil", "official"): {"samples_per_s": [100.0, 90.0, 110.0]},
    }
    row = run.build_row(p12, results, _common.SIZES["quick"], context, [1.5, 2.0])
    assert row["measured"]["tinker_sync_commit"] == "abc"
    assert row["measured"]["tinker"] == "0.38.0" and row["measured"]["cores"] == 2
    assert row["measured"]["loadavg_1min"] == [1.5, 2.0]
    assert (row["spread"]["ours"]["min"], row["spread"]["ours"]["max"]) == (290.0, 310.0)
    assert row["ratio"] == pytest.approx(3.0) and row["met"] is True
    assert "measured" not in run.build_row(p12, results, _common.SIZES["quick"])


def test_p12_loop_and_done_checker() -> None:
    import concurrent.futures

    import _sdk_rows

    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) == 3

    iterations, seconds = _sdk_rows.user_loop(stop, 600.0)
    assert iterations == 3 * _sdk_rows.LOOP_CHUNK and seconds > 0.0
    futures: list[concurrent.futures.Future[int]] = [concurrent.futures.Future() for _ in range(3)]
    all_done = _sdk_rows.done_checker(futures)
    futures[1].set_result(1)
    assert not all_done()
    futures[0].set_result(0)
    assert not all_done()
    futures[2].set_result(2)
    assert all_done() and all_done()
    assert _sdk_rows.done_checker([])()
