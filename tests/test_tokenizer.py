"""Tests for tinker_sync.tokenizer and tinker_sync._byte_tokenizer
(docs/design/behavior.md#tokenizer-resolution, docs/design/behavior.md#tokenizer-cache,
docs/design/behavior.md#tokenizer-adapter).

Unit tests never touch the network: an autouse fixture installs a loader that fails the test if
the Hub would be contacted. The real Hub loader is exercised in a subprocess against a fake
Hugging Face endpoint on 127.0.0.1.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import tinker_sync
import tinker_sync.tokenizer as tokmod
from tinker_sync import _byte_tokenizer as bytetok
from tinker_sync.exceptions import TokenizerLoadError, TokenizerUnavailableError
from tinker_sync.tokenizer import (
    LLAMA3_TOKENIZER_ID,
    TinkerTokenizer,
    load_tokenizer,
    resolve_tokenizer_id,
    set_tokenizer_loader,
)

HANG_GUARD = 60.0  # seconds; reaching it fails the test

CORPUS = [
    "The weather today is sunny with a light breeze from the west.",
    "Tokenizers split text into pieces; models learn from the pieces.",
    "Fine-tuning a language model takes data, patience and a good learning rate.",
    "héllo wörld, ça va? 日本語のテキストも少し。 Emoji: 🎉🚀",
    "def add(a, b):\n    return a + b\n",
    "    indented   text\twith\ttabs and  double  spaces",
] * 20


def _no_network_loader(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
    raise AssertionError(f"unit test tried to load {tokenizer_id!r} from the Hub")


@pytest.fixture(autouse=True)
def _isolated_cache() -> Iterator[None]:
    tokmod._reset_tokenizer_cache()
    previous = set_tokenizer_loader(_no_network_loader)
    try:
        yield
    finally:
        set_tokenizer_loader(previous)
        tokmod._reset_tokenizer_cache()


def _byte() -> TinkerTokenizer:
    return TinkerTokenizer(
        bytetok.build_byte_tokenizer(),
        name_or_path=bytetok.BYTE_TOKENIZER_ID,
        config=bytetok.tokenizer_config,
    )


def build_bpe() -> Tokenizer:
    """A real byte-level BPE tokenizer trained in memory, with a BOS post-processor."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<s>", "</s>", "<pad>", "<extra_0>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_tokens(["<added_word>"])  # an added token outside the model vocabulary
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


BPE_CONFIG: dict[str, Any] = {
    "bos_token": "<s>",
    "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},
    "pad_token": "<pad>",
    "additional_special_tokens": ["<extra_0>"],
    "chat_template": [
        {"name": "tool_use", "template": "TOOLS {{ messages }}"},
        {"name": "default", "template": "{{ messages }}"},
    ],
}


def _bpe() -> TinkerTokenizer:
    return TinkerTokenizer(build_bpe(), name_or_path="test/bpe", config=BPE_CONFIG)


# ---------------------------------------------------------------------------------------------
# docs/design/behavior.md#tokenizer-resolution: resolution
# ---------------------------------------------------------------------------------------------

RESOLUTION_TABLE = [
    # (model name, server tokenizer id, resolved id)
    ("Qwen/Qwen3-8B", None, "Qwen/Qwen3-8B"),
    ("Qwen/Qwen3-8B:abc", None, "Qwen/Qwen3-8B"),
    ("Qwen/Qwen3-8B:abc:def", None, "Qwen/Qwen3-8B"),
    ("gpt2", None, "gpt2"),
    ("meta-llama/Llama-3.1-8B", None, LLAMA3_TOKENIZER_ID),
    ("meta-llama/Llama-3.3-70B-Instruct:v2", None, LLAMA3_TOKENIZER_ID),
    ("meta-llama/Llama-3.1-8B/lora", None, LLAMA3_TOKENIZER_ID),
    ("meta-llama/Llama-2-7b-hf", None, "meta-llama/Llama-2-7b-hf"),
    ("org/model/variant", None, "org/model"),
    ("org/model/variant:rev", None, "org/model"),
    ("a/b/c/d", None, "a/b/c/d"),
    ("moonshotai/Kimi-K2.5-Text-Only", None, "moonshotai/Kimi-K2.5-Text-Only"),
    # The server id wins, cut at its first ':', and bypasses every heuristic.
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("org/model/variant", "org/model/variant", "org/model/variant"),
    ("anything/at:all", "Qwen/Qwen3-8B:abc", "Qwen/Qwen3-8B"),
    ("Qwen/Qwen3-8B", "", "Qwen/Qwen3-8B"),
    # Built in.
    ("tinker-sync/tiny", None, "tinker-sync/byte"),
    ("tinker-sync/instant:7", None, "tinker-sync/byte"),
    ("tinker-sync/tiny/lora", None, "tinker-sync/byte"),
    ("Qwen/Qwen3-8B", "tinker-sync/byte", "tinker-sync/byte"),
    ("tinker-sync/byte", None, "tinker-sync/byte"),
]


@pytest.mark.parametrize(("model", "server_id", "expected"), RESOLUTION_TABLE)
def test_resolution_table(model: str, server_id: str | None, expected: str) -> None:
    assert resolve_tokenizer_id(model, server_id) == expected


@pytest.fixture
def official_resolver(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str | None], Any]:
    """The official SDK's resolver, with AutoTokenizer replaced by a recorder."""
    try:
        from tinker.lib.public_interfaces import sampling_client as sc
    except (ImportError, OSError) as exc:  # not installed, or a broken optional dependency
        pytest.skip(f"official SDK unavailable: {exc}")
    calls: list[tuple[str, dict[str, Any]]] = []

    class RecordingAutoTokenizer:
        @staticmethod
        def from_pretrained(tokenizer_id: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
            calls.append((tokenizer_id, kwargs))
            return tokenizer_id, kwargs

    fake = types.ModuleType("transformers.models.auto.tokenization_auto")
    fake.AutoTokenizer = RecordingAutoTokenizer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers.models.auto.tokenization_auto", fake)

    def resolve(model: str, server_id: str | None) -> Any:
        # get_info already cuts the server id at ':' before the official helper sees it.
        cut = server_id.split(":", 1)[0] if server_id is not None else None
        return sc._load_tokenizer_from_model_info(model, cut)

    return resolve


@pytest.mark.parametrize(
    ("model", "server_id", "expected"),
    # Not compared: our local models, and an empty server id, which the official SDK never
    # passes (get_info drops it); test_resolution_table covers both on our side.
    [
        row
        for row in RESOLUTION_TABLE
        if "tinker-sync" not in row[0] + (row[1] or "") and row[1] != ""
    ],
)
def test_resolution_matches_official_sdk(
    official_resolver: Callable[[str, str | None], Any],
    model: str,
    server_id: str | None,
    expected: str,
) -> None:
    official_id, _kwargs = official_resolver(model, server_id)
    assert resolve_tokenizer_id(model, server_id) == expected
    if "Kimi" in model:
        assert official_id == "moonshotai/Kimi-K2.5"  # the pin alias; we refuse below
    else:
        assert official_id == expected


@pytest.mark.parametrize("model", sorted(tokmod._REMOTE_CODE_PINS))
def test_remote_code_pins_match_official_and_raise(
    official_resolver: Callable[[str, str | None], Any], model: str
) -> None:
    official_id, kwargs = official_resolver(model, None)
    assert kwargs["trust_remote_code"] is True
    assert tokmod._REMOTE_CODE_PINS[model] == (official_id, kwargs["revision"])
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(model)
    message = str(info.value)
    assert "trust_remote_code" in message
    assert kwargs["revision"] in message
    assert official_id in message


@pytest.mark.parametrize(
    ("name", "server_id"),
    [
        ("TML/house-model", None),
        ("thinkingmachines/base", None),
        ("Qwen/Qwen3-8B", "TML/house-tokenizer:v3"),
    ],
)
def test_tml_tokenizers_raise_with_advice(name: str, server_id: str | None) -> None:
    with pytest.raises(TokenizerUnavailableError) as info:
        load_tokenizer(name, tokenizer_id=server_id)
    # "tml-renderers" would look like an API key to the scrubber; pip accepts either spelling.
    assert "pip install tml_renderers" in str(info.value)


def test_tml_official_sdk_refuses_too(official_resolver: Callable[[str, str | None], Any]) -> None:
    if "tml_tokenizers" in sys.modules:
        pytest.skip("tml_tokenizers is installed")
    with pytest.raises(RuntimeError, match="tml-renderers"):
        official_resolver("TML/house-model", None)


@pytest.mark.parametrize("name", ["tinker-sync/nope", "", ":rev"])
def test_unknown_builtin_and_empty_ids_raise(name: str) -> None:
    with pytest.raises(TokenizerLoadError):
        load_tokenizer(name)


def test_builtin_ids_share_one_instance_without_the_loader() -> None:
    tiny = load_tokenizer("tinker-sync/tiny")
    assert load_tokenizer("tinker-sync/byte") is tiny
    assert load_tokenizer("Qwen/Qwen3-8B", tokenizer_id="tinker-sync/byte:1") is tiny
    assert load_tokenizer("tinker-sync/instant", revision="ignored") is tiny
    assert tiny.name_or_path == "tinker-sync/byte"


def test_cache_is_keyed_by_resolved_id_and_revision() -> None:
    calls: list[tuple[str, str | None]] = []

    def loader(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        calls.append((tokenizer_id, revision))
        return TinkerTokenizer(bytetok.build_byte_tokenizer(), name_or_path=tokenizer_id)

    set_tokenizer_loader(loader)
    first = load_tokenizer("org/model/variant")
    assert load_tokenizer("org/model") is first
    assert load_tokenizer("org/model:abc") is first
    assert load_tokenizer("other", tokenizer_id="org/model:xyz") is first
    pinned = load_tokenizer("org/model", revision="v1")
    assert pinned is not first
    assert load_tokenizer("org/model/x", revision="v1") is pinned
    assert calls == [("org/model", None), ("org/model", "v1")]


def test_set_tokenizer_loader_returns_previous_and_none_restores_default() -> None:
    def loader(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        raise AssertionError

    assert set_tokenizer_loader(loader) is _no_network_loader
    assert set_tokenizer_loader(None) is loader
    assert set_tokenizer_loader(_no_network_loader) is tokmod._load_from_hub


# ---------------------------------------------------------------------------------------------
# docs/design/behavior.md#tokenizer-cache: single flight, failures not cached, parallel ids, LRU
# ---------------------------------------------------------------------------------------------


class GatedLoader:
    """Counts calls, signals when a load starts, and blocks until released."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        with self._lock:
            self.calls += 1
        self.started.set()
        if not self.release.wait(HANG_GUARD):
            raise AssertionError("gated loader was never released")
        if self.fail is not None:
            raise self.fail
        return TinkerTokenizer(bytetok.build_byte_tokenizer(), name_or_path=tokenizer_id)


class JoinCounter:
    """The cache's join hook: lets the test wait until N callers wait on one in-flight load."""

    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()

    def __call__(self, key: tuple[str, str | None]) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.count >= n, HANG_GUARD), (
                f"only {self.count} of {n} callers joined the in-flight load"
            )


def _run_threads(n: int, target: Callable[[], Any]) -> list[Any]:
    """Run ``target`` in n barrier-released threads; return each result or exception."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def work(i: int) -> None:
        barrier.wait(HANG_GUARD)
        try:
            results[i] = target()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return _join_all(threads, results)


def _join_all(threads: list[threading.Thread], results: list[Any]) -> list[Any]:
    for t in threads:
        t.join(HANG_GUARD)
        assert not t.is_alive(), "a thread hung"
    return results


def _start_threads(n: int, target: Callable[[], Any]) -> tuple[list[threading.Thread], list[Any]]:
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def work(i: int) -> None:
        barrier.wait(HANG_GUARD)
        try:
            results[i] = target()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def test_32_concurrent_misses_load_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = GatedLoader()
    joins = JoinCounter()
    set_tokenizer_loader(loader)
    monkeypatch.setattr(tokmod, "_join_hook", joins)
    threads, results = _start_threads(32, lambda: load_tokenizer("org/model"))
    assert loader.started.wait(HANG_GUARD)
    joins.wait_for(31)  # every other caller waits on the one load
    loader.release.set()
    _join_all(threads, results)
    assert loader.calls == 1
    assert all(isinstance(r, TinkerTokenizer) for r in results)
    assert len({id(r) for r in results}) == 1
    assert load_tokenizer("org/model") is results[0]
    assert loader.calls == 1


def _root_cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def test_failed_load_reaches_all_32_and_is_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    boom = RuntimeError("hub exploded")
    loader = GatedLoader(fail=boom)
    joins = JoinCounter()
    set_tokenizer_loader(loader)
    monkeypatch.setattr(tokmod, "_join_hook", joins)
    threads, results = _start_threads(32, lambda: load_tokenizer("org/model"))
    assert loader.started.wait(HANG_GUARD)
    joins.wait_for(31)
    loader.release.set()
    _join_all(threads, results)
    assert loader.calls == 1
    for r in results:
        assert isinstance(r, TokenizerLoadError)
        assert "hub exploded" in str(r)
        assert "org/model" in str(r)
        assert _root_cause(r) is boom
    assert tokmod._inflight == {}
    # Not cached: the next call loads again, and can succeed.
    loader.fail = None
    assert isinstance(load_tokenizer("org/model"), TinkerTokenizer)
    assert loader.calls == 2


def test_different_ids_load_in_parallel() -> None:
    started = {"a/x": threading.Event(), "b/y": threading.Event()}
    other = {"a/x": "b/y", "b/y": "a/x"}

    def loader(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        started[tokenizer_id].set()
        # Each load waits for the other one to start: serialized loads would deadlock here.
        if not started[other[tokenizer_id]].wait(HANG_GUARD):
            raise AssertionError("loads of different ids were serialized")
        return TinkerTokenizer(bytetok.build_byte_tokenizer(), name_or_path=tokenizer_id)

    set_tokenizer_loader(loader)
    ids = iter(["a/x", "b/y"])
    lock = threading.Lock()

    def take() -> TinkerTokenizer:
        with lock:
            name = next(ids)
        return load_tokenizer(name)

    results = _run_threads(2, take)
    assert sorted(r.name_or_path for r in results) == ["a/x", "b/y"]


def test_interrupted_load_fails_waiters_and_retries() -> None:
    class Interrupting:
        calls = 0

        def __call__(self, tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
            self.calls += 1
            if self.calls == 1:
                raise KeyboardInterrupt
            return TinkerTokenizer(bytetok.build_byte_tokenizer(), name_or_path=tokenizer_id)

    loader = Interrupting()
    set_tokenizer_loader(loader)
    with pytest.raises(KeyboardInterrupt):
        load_tokenizer("org/model")
    assert tokmod._inflight == {}
    assert load_tokenizer("org/model").name_or_path == "org/model"
    assert loader.calls == 2


def test_loader_errors_are_wrapped_and_bad_results_rejected() -> None:
    own = TokenizerLoadError("custom message")

    def raises_own(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        raise own

    set_tokenizer_loader(raises_own)
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer("org/a")
    assert info.value is own

    def wrong_type(tokenizer_id: str, revision: str | None) -> Any:
        return bytetok.build_byte_tokenizer()

    set_tokenizer_loader(wrong_type)
    with pytest.raises(TokenizerLoadError, match="returned Tokenizer"):
        load_tokenizer("org/b")


def test_lru_keeps_32_entries_and_evicts_least_recently_used() -> None:
    calls: list[str] = []

    def loader(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        calls.append(tokenizer_id)
        return TinkerTokenizer(bytetok.build_byte_tokenizer(), name_or_path=tokenizer_id)

    set_tokenizer_loader(loader)
    names = [f"org/m{i}" for i in range(33)]
    first = {name: load_tokenizer(name) for name in names[:32]}
    assert len(calls) == 32
    assert load_tokenizer(names[0]) is first[names[0]]  # a hit refreshes m0
    load_tokenizer(names[32])  # 33rd entry evicts the least recently used: m1
    assert len(calls) == 33
    assert load_tokenizer(names[0]) is first[names[0]]
    assert load_tokenizer(names[31]) is first[names[31]]
    assert len(calls) == 33
    reloaded = load_tokenizer(names[1])
    assert reloaded is not first[names[1]]
    assert calls[-1] == names[1]
    assert len(calls) == 34
    assert len(tokmod._cache) == tokmod.CACHE_SIZE == 32


def _child_loads_while_parent_load_in_flight(queue: Any) -> None:
    # In the forked child the parent's in-flight load has no thread to finish it.
    def loader(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        return TinkerTokenizer(bytetok.build_byte_tokenizer(), name_or_path=tokenizer_id)

    fresh = tokmod._inflight == {}
    set_tokenizer_loader(loader)
    tok = load_tokenizer("org/model")
    queue.put((tok.name_or_path, tok.encode("ok"), fresh))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_gets_a_fresh_inflight_table() -> None:
    loader = GatedLoader()
    set_tokenizer_loader(loader)
    threads, results = _start_threads(1, lambda: load_tokenizer("org/model"))
    assert loader.started.wait(HANG_GUARD)
    assert ("org/model", None) in tokmod._inflight
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with tokmod._lock:  # also prove a lock held at fork does not hang the child
        child = ctx.Process(target=_child_loads_while_parent_load_in_flight, args=(queue,))
        child.start()
    try:
        assert queue.get(timeout=HANG_GUARD) == ("org/model", [111, 107], True)
        child.join(HANG_GUARD)
        assert child.exitcode == 0
    finally:
        loader.release.set()
        if child.is_alive():
            child.kill()
    _join_all(threads, results)
    assert isinstance(results[0], TinkerTokenizer)


# ---------------------------------------------------------------------------------------------
# docs/design/behavior.md#tokenizer-adapter: concurrent encode/decode match serial output
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [_byte, _bpe], ids=["byte", "bpe"])
def test_16_threads_encode_and_decode_like_serial(make: Callable[[], TinkerTokenizer]) -> None:
    tok = make()
    texts = sorted(set(CORPUS)) + [t * 7 for t in sorted(set(CORPUS))] + ["", "<s></s><pad>"]

    def work() -> list[Any]:
        out: list[Any] = []
        for i, text in enumerate(texts):
            flag = i % 2 == 0
            ids = tok.encode(text, add_special_tokens=flag)
            out.append(ids)
            out.append(tok.decode(ids, skip_special_tokens=not flag))
            out.append(tok.decode(np.asarray(ids, dtype=np.int32)))
        out.append(tok.encode_batch(texts, add_special_tokens=False))
        out.append(tok.batch_decode(out[0:30:3], skip_special_tokens=True))
        return out

    serial = work()
    results = _run_threads(16, work)
    for r in results:
        assert not isinstance(r, BaseException), r
        assert r == serial


def _vocab_id(backend: Tokenizer, token: str) -> int:
    found = backend.token_to_id(token)
    assert found is not None, token
    return found


def test_bpe_adapter_reads_config_and_honours_flags_per_call() -> None:
    tok = _bpe()
    backend = tok.backend_tokenizer
    bos, eos, pad, extra = (_vocab_id(backend, t) for t in ["<s>", "</s>", "<pad>", "<extra_0>"])
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (bos, eos, pad)
    assert tok.unk_token is None and tok.unk_token_id is None
    assert tok.all_special_tokens == ["<s>", "</s>", "<pad>", "<extra_0>"]
    assert tok.all_special_ids == [bos, eos, pad, extra]
    assert tok.chat_template == "{{ messages }}"
    assert tok.init_kwargs == BPE_CONFIG
    with_bos = tok.encode("The weather today is")
    without = tok.encode("The weather today is", add_special_tokens=False)
    assert with_bos == [bos, *without]
    assert len(without) < len("The weather today is")  # merges were learned
    assert tok.decode(with_bos) == "<s>The weather today is"
    assert tok.decode(with_bos, skip_special_tokens=True) == "The weather today is"
    assert tok.vocab_size == 420
    assert len(tok) == 421 == len(tok.get_vocab())
    assert tok.convert_tokens_to_ids("<added_word>") == 420
    assert tok.convert_tokens_to_ids("<pad>") == pad
    assert tok.convert_tokens_to_ids(["</s>", "no-such-token"]) == [eos, None]
    assert tok.convert_ids_to_tokens(eos) == "</s>"
    assert tok.convert_ids_to_tokens([bos, without[0]], skip_special_tokens=True) == [
        backend.id_to_token(without[0])
    ]
    assert backend.truncation is None and backend.padding is None


def test_adapter_without_config_uses_backend_specials_and_disables_truncation() -> None:
    backend = build_bpe()
    backend.enable_truncation(max_length=3)
    backend.enable_padding(length=50)
    tok = TinkerTokenizer(backend, name_or_path="test/bpe")
    assert tok.bos_token is None and tok.eos_token_id is None and tok.pad_token_id is None
    assert tok.chat_template is None
    assert tok.all_special_tokens == ["<s>", "</s>", "<pad>", "<extra_0>"]
    long_text = CORPUS[0] * 3
    assert len(tok.encode(long_text, add_special_tokens=False)) > 3
    assert tok.decode(tok.encode(long_text, add_special_tokens=False)) == long_text


def test_chat_template_forms() -> None:
    backend = bytetok.build_byte_tokenizer()
    for raw, expected in [
        ("{{ x }}", "{{ x }}"),
        ([{"name": "a", "template": "A"}, {"name": "b", "template": "B"}], "A"),
        ([{"name": "b", "template": "B"}, {"name": "default", "template": "D"}], "D"),
        (None, None),
        (17, None),
    ]:
        tok = TinkerTokenizer(backend, name_or_path="t", config={"chat_template": raw})
        assert tok.chat_template == expected


# ---------------------------------------------------------------------------------------------
# The byte tokenizer
# ---------------------------------------------------------------------------------------------


def test_byte_layout_matches_the_local_backends() -> None:
    base = pytest.importorskip("tinker_sync.local.backends.base")
    assert bytetok.BYTE_TOKENIZER_ID == base.BYTE_TOKENIZER_ID
    assert bytetok.EOS_TOKEN_ID == base.EOS_TOKEN_ID == 256
    assert bytetok.BOS_TOKEN_ID == base.BOS_TOKEN_ID == 257
    assert bytetok.PAD_TOKEN_ID == base.PAD_TOKEN_ID == 258
    assert bytetok.BYTE_VOCAB_SIZE == base.BYTE_VOCAB_SIZE == 259


def test_byte_tokenizer_special_tokens_and_vocab() -> None:
    tok = load_tokenizer("tinker-sync/byte")
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (256, 257, 258)
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == ("<|endoftext|>", "<|bos|>", "<|pad|>")
    assert tok.all_special_tokens == ["<|bos|>", "<|endoftext|>", "<|pad|>"]
    assert tok.all_special_ids == [257, 256, 258]
    assert tok.vocab_size == 256
    assert len(tok) == bytetok.BYTE_VOCAB_SIZE == len(tok.get_vocab())
    assert tok.chat_template is None
    assert tok.convert_tokens_to_ids(["<|pad|>", "<|endoftext|>"]) == [258, 256]
    assert tok.convert_ids_to_tokens(257) == "<|bos|>"
    assert tok.convert_ids_to_tokens(999) is None
    # The vocabulary holds exactly ids 0..258.
    assert sorted(tok.get_vocab().values()) == list(range(259))


def test_byte_tokenizer_text_is_always_bytes() -> None:
    tok = load_tokenizer("tinker-sync/byte")
    text = "a<|endoftext|>b<|bos|><|pad|>"
    assert tok.encode(text) == list(text.encode())
    assert tok.encode(text, add_special_tokens=True) == tok.encode(text, add_special_tokens=False)
    assert tok.decode([104, 105, 256, 257, 258]) == "hi<|endoftext|><|bos|><|pad|>"
    assert tok.decode([104, 105, 256, 257, 258], skip_special_tokens=True) == "hi"


def test_byte_tokenizer_decode_accepts_arrays_and_ints() -> None:
    tok = load_tokenizer("tinker-sync/byte")
    ids = list("héllo".encode())
    for dtype in (np.int32, np.int64, np.uint8, np.uint16):
        assert tok.decode(np.asarray(ids, dtype=dtype)) == "héllo"
    assert tok.decode(104) == "h"
    assert tok.decode(np.int64(105)) == "i"
    assert tok.batch_decode([np.asarray(ids), ids[:1]]) == ["héllo", "h"]
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="integers"):
        tok.decode(np.zeros(2, dtype=np.float32))


def test_byte_tokenizer_pickles_with_its_behaviour() -> None:
    tok = load_tokenizer("tinker-sync/byte")
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.name_or_path == "tinker-sync/byte"
    assert clone.encode("x<|endoftext|>") == tok.encode("x<|endoftext|>")
    assert clone.eos_token_id == 256
    assert "tinker-sync/byte" in repr(clone)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_byte_round_trip_any_unicode(text: str) -> None:
    tok = load_tokenizer("tinker-sync/byte")
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, text[::-1]]) == [ids, list(text[::-1].encode())]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_byte_decode_of_arbitrary_bytes_is_lossy_utf8(data: bytes) -> None:
    tok = load_tokenizer("tinker-sync/byte")
    assert tok.decode(list(data)) == data.decode("utf-8", errors="replace")


def test_build_byte_tokenizer_returns_independent_instances() -> None:
    a = bytetok.build_byte_tokenizer()
    b = bytetok.build_byte_tokenizer()
    assert a is not b
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size(with_added_tokens=True) == 259


# ---------------------------------------------------------------------------------------------
# The Hub loader
# ---------------------------------------------------------------------------------------------


def test_config_is_skipped_without_huggingface_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert tokmod._fetch_tokenizer_config("org/model", None, None) is None


def test_hub_loader_without_huggingface_hub_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tokenizers' from_pretrained imports huggingface_hub; blocking the import fails fast.
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(TokenizerLoadError, match="pip install huggingface_hub"):
        tokmod._load_from_hub("org/model", None)


def test_hub_file_error_classification() -> None:
    hub_errors = pytest.importorskip("huggingface_hub.errors")
    offline = {"value": False}

    class FakeHub:
        errors = hub_errors

        class constants:  # noqa: N801
            HF_HUB_OFFLINE = False

        @staticmethod
        def hf_hub_download(repo_id: str, filename: str, **kwargs: Any) -> str:
            FakeHub.constants.HF_HUB_OFFLINE = offline["value"]
            raise hub_errors.LocalEntryNotFoundError("connection refused, nothing cached")

    with pytest.raises(TokenizerLoadError, match="tokenizer_config.json"):
        tokmod._hub_file(FakeHub, "org/model", "tokenizer_config.json", None, None)
    offline["value"] = True
    assert tokmod._hub_file(FakeHub, "org/model", "tokenizer_config.json", None, None) is None


FAKE_HUB_SCRIPT = r"""
import hashlib, http.server, json, os, sys, threading

FILES = json.loads(sys.argv[1])      # {"org/model/filename": text}
LOG = []

class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _reply(self, with_body):
        LOG.append([self.command, self.path.split("?")[0], self.headers.get("authorization")])
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            if any(k.startswith(repo + "/") for k in FILES):
                data = FILES.get(repo + "/" + name)
                if data is not None:
                    body = data.encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("ETag", '"%s"' % hashlib.sha1(body).hexdigest())
                    self.send_header("X-Repo-Commit", "c" * 40)
                    self.end_headers()
                    if with_body:
                        self.wfile.write(body)
                    return
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
            else:
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
        else:
            self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self._reply(True)

    def do_HEAD(self):
        self._reply(False)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:%d" % server.server_address[1]

from tinker_sync.exceptions import TokenizerLoadError
from tinker_sync.tokenizer import load_tokenizer

out = {}
tok = load_tokenizer("org/model/variant")
again = load_tokenizer("org/model")
out["model"] = {
    "same": tok is again,
    "name": tok.name_or_path,
    "ids": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id],
    "template": tok.chat_template,
    "encode": tok.encode("hello"),
}
tmpl = load_tokenizer("org/templ")
out["templ"] = {"template": tmpl.chat_template, "eos": tmpl.eos_token_id}
errors = []
for _ in range(2):
    try:
        load_tokenizer("org/missing")
    except TokenizerLoadError as exc:
        errors.append(str(exc))
out["errors"] = errors
out["log"] = LOG
print(json.dumps(out))
"""


def test_hub_loader_against_a_fake_endpoint(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    backend = bytetok.build_byte_tokenizer()
    files = {
        "org/model/tokenizer.json": backend.to_str(),
        "org/model/tokenizer_config.json": json.dumps(
            {
                "bos_token": "<|bos|>",
                "eos_token": {"content": "<|endoftext|>", "__type": "AddedToken"},
                "pad_token": None,
                "chat_template": "{% for m in messages %}{{ m }}{% endfor %}",
            }
        ),
        "org/templ/tokenizer.json": backend.to_str(),
        "org/templ/chat_template.jinja": "JINJA {{ messages }}",
    }
    script = tmp_path / "fake_hub.py"
    script.write_text(textwrap.dedent(FAKE_HUB_SCRIPT))
    secret = "hf_unit_test_secret_value"
    repo_root = str(Path(tinker_sync.__file__).resolve().parents[1])
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "PYTHONPATH"
    }
    env.update(
        HF_HOME=str(tmp_path / "hf_home"),
        HF_TOKEN=secret,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_ETAG_TIMEOUT="5",
        HF_HUB_DOWNLOAD_TIMEOUT="5",
        PYTHONPATH=repo_root,
    )
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    model = out["model"]
    assert model["same"] is True
    assert model["name"] == "org/model"
    assert model["ids"] == [257, 256, None]
    assert model["template"] == "{% for m in messages %}{{ m }}{% endfor %}"
    assert model["encode"] == list(b"hello")
    assert out["templ"] == {"template": "JINJA {{ messages }}", "eos": None}
    # Failures are TokenizerLoadError, carry no token, and are retried (not cached).
    assert len(out["errors"]) == 2
    for message in out["errors"]:
        assert "org/missing" in message
        assert secret not in message
    log = [tuple(entry) for entry in out["log"]]
    missing = [e for e in log if e[1].startswith("/org/missing/")]
    assert len(missing) >= 2
    hub_requests = [e for e in log if "/resolve/" in e[1]]
    assert hub_requests
    assert all(e[2] == f"Bearer {secret}" for e in hub_requests)
    # tokenizer.json of org/model was downloaded once (the second load hit the cache).
    gets = [e for e in log if e[0] == "GET" and e[1] == "/org/model/resolve/main/tokenizer.json"]
    assert len(gets) == 1
    assert list(
        (tmp_path / "hf_home" / "hub").glob("models--org--model/snapshots/*/tokenizer.json")
    )


def test_a_local_model_directory_loads_its_own_tokenizer_files(tmp_path: Path) -> None:
    """Servers serving local checkpoints send no tokenizer id: the model name is a path."""
    directory = tmp_path / "models" / "step-100"  # "a/b/c"-shaped: never cut to "org/model"
    directory.mkdir(parents=True)
    bytetok.build_byte_tokenizer().save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>"}))
    (directory / "chat_template.jinja").write_text("{{ messages }}")
    name = str(directory)
    assert resolve_tokenizer_id(name) == name

    def no_hub(tokenizer_id: str, revision: str | None) -> TinkerTokenizer:
        raise AssertionError(f"the Hub loader was asked for {tokenizer_id!r}")

    previous = set_tokenizer_loader(no_hub)
    try:
        tok = load_tokenizer(name)
        assert tok.name_or_path == name and tok.chat_template == "{{ messages }}"
        assert tok.decode(tok.encode("héllo", add_special_tokens=False)) == "héllo"
        (tmp_path / "empty").mkdir()
        with pytest.raises(TokenizerLoadError, match="without a tokenizer.json"):
            load_tokenizer(str(tmp_path / "empty"))
    finally:
        set_tokenizer_loader(previous)
        tokmod._reset_tokenizer_cache()
