"""Tests of the helpers shared by the local backends (_common, _losses)."""

from __future__ import annotations

import numpy as np
import pytest

from tinker_sync.local.backends._common import (
    ADAM_DEFAULTS,
    MASK_LOGPROB,
    StopRule,
    check_sample_options,
    npz_bytes,
    npz_load,
    parse_adam_params,
    topk_table,
)
from tinker_sync.local.backends._losses import prepare_inputs, token_loss
from tinker_sync.local.backends.base import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    DatumArrays,
    SampleOptions,
    UserError,
)
from tinker_sync.local.backends.tiny.backend import _micro_batches


def test_stop_rule_defaults_and_explicit_lists() -> None:
    implicit = StopRule.from_options(SampleOptions())
    assert implicit.tokens == {EOS_TOKEN_ID} and implicit.strings == ()
    assert implicit.banned_tokens == [BOS_TOKEN_ID, PAD_TOKEN_ID]
    none = StopRule.from_options(SampleOptions(stop_strings=[]))
    assert not none.tokens and not none.strings
    assert EOS_TOKEN_ID in none.banned_tokens
    strings = StopRule.from_options(SampleOptions(stop_strings=["\n", "", "é"]))
    assert strings.strings == (b"\n", "é".encode())
    assert strings.hit(ord("\n"), b"abc\n") and not strings.hit(ord("c"), b"abc")
    assert strings.hit(0xA9, "xé".encode())
    tokens = StopRule.from_options(SampleOptions(stop_tokens=[5, EOS_TOKEN_ID]))
    assert tokens.hit(5, b"") and EOS_TOKEN_ID not in tokens.banned_tokens


def test_topk_table_orders_breaks_ties_and_pads() -> None:
    logp = np.log(np.array([[0.1, 0.4, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1]]))
    ids, vals = topk_table(logp, 6)
    assert ids.dtype == np.int32 and vals.dtype == np.float32
    assert ids[0, :3].tolist() == [1, 2, 0] and ids[1, 0] == 0
    assert ids[:, 4:].tolist() == [[0, 0], [0, 0]]
    assert (vals[:, 4:] == MASK_LOGPROB).all()


def test_adam_params_defaults_and_validation() -> None:
    assert parse_adam_params({}) == ADAM_DEFAULTS
    assert (
        parse_adam_params({"type": "adam", "learning_rate": 3, "eps": None})["learning_rate"] == 3.0
    )
    for bad in (
        {"type": "dimuon"},
        {"beta2": -0.1},
        {"weight_decay": -1},
        {"grad_clip_norm": float("inf")},
    ):
        with pytest.raises(UserError):
            parse_adam_params(bad)


def test_sample_options_resolution() -> None:
    chk = check_sample_options(
        SampleOptions(prompt_logprobs=True, prompt_logprobs_last_n=2),
        prompt_len=5,
        vocab_size=259,
        default_max_tokens=7,
    )
    assert chk.first_scored == 3 and chk.max_tokens == 7
    with pytest.raises(UserError, match="at least one token"):
        check_sample_options(SampleOptions(), prompt_len=0, vocab_size=259, default_max_tokens=1)
    with pytest.raises(UserError, match="stop tokens"):
        check_sample_options(
            SampleOptions(stop_tokens=[-3]), prompt_len=2, vocab_size=259, default_max_tokens=1
        )


def test_npz_round_trip_and_corruption() -> None:
    blob = npz_bytes({"a": np.arange(3)}, {"k": [1, "x"]})
    arrays, meta = npz_load(blob)
    assert arrays["a"].tolist() == [0, 1, 2] and meta == {"k": [1, "x"]}
    with pytest.raises(UserError, match="cannot read"):
        npz_load(blob[:20])


def test_rl_losses_mask_tokens_with_zero_weight() -> None:
    datum = DatumArrays(
        np.arange(4),
        {
            "target_tokens": np.arange(1, 5),
            "weights": np.array([1, 0, 2, 0], np.float32),
            "logprobs": np.full(4, -1.0, np.float32),
            "advantages": np.array([1.0, 5.0, -1.0, 3.0], np.float32),
        },
    )
    inp = prepare_inputs(datum, "importance_sampling", n_tokens=4, vocab_size=None)
    lp = np.full(4, -1.0)
    loss, grad = token_loss("importance_sampling", lp, inp, {})
    assert loss.tolist() == [-1.0, 0.0, 1.0, 0.0]  # ratio 1, weight used as a 0/1 mask
    assert grad.tolist() == loss.tolist()
    ce_loss, ce_grad = token_loss("cross_entropy", lp, inp, {})
    assert ce_loss.tolist() == [1.0, 0.0, 2.0, 0.0] and ce_grad.tolist() == [-1.0, 0.0, -2.0, 0.0]


def test_ppo_gradient_vanishes_only_where_the_clip_binds() -> None:
    datum = DatumArrays(
        np.arange(4),
        {
            "target_tokens": np.arange(4),
            "logprobs": np.zeros(4, np.float32),
            "advantages": np.array([1.0, 1.0, -1.0, -1.0], np.float32),
        },
    )
    inp = prepare_inputs(datum, "ppo", n_tokens=4, vocab_size=None)
    lp = np.log(np.array([1.5, 0.5, 1.5, 0.5]))  # ratios
    loss, grad = token_loss("ppo", lp, inp, {})
    np.testing.assert_allclose(loss, [-1.2, -0.5, 1.5, 0.8])
    # A>0 & r>hi: clipped (no grad); A>0 & r<lo: unclipped; A<0 & r>hi: unclipped; A<0 & r<lo: clipped
    np.testing.assert_allclose(grad, [0.0, -0.5, 1.5, 0.0])


def test_micro_batches_respect_budgets() -> None:
    lengths = [512] * 20 + [10] * 100
    groups = _micro_batches(lengths, n_heads=4)
    assert sorted(i for g in groups for i in g) == list(range(120))
    for g in groups:
        t = max(lengths[i] for i in g)
        assert len(g) == 1 or (len(g) * t <= 8192 and len(g) * 4 * t * t <= 1 << 23)


def test_single_threaded_blas_nests_and_restores() -> None:
    import threading

    from tinker_sync.local.backends import _blas

    api = _blas._get_api()
    if api is None:
        pytest.skip("numpy is not linked against a discoverable OpenBLAS")
    before = api.get_threads()
    api.set_threads(2)
    try:
        inside: list[int] = []
        release = threading.Event()
        entered = threading.Event()

        def worker() -> None:
            with _blas.single_threaded_blas():
                entered.set()
                release.wait(10)

        t = threading.Thread(target=worker)
        with _blas.single_threaded_blas():
            inside.append(api.get_threads())
            t.start()
            assert entered.wait(10)
            with _blas.single_threaded_blas():
                inside.append(api.get_threads())
        inside.append(api.get_threads())  # the worker is still inside
        release.set()
        t.join(10)
        assert inside == [1, 1, 1]
        assert api.get_threads() == 2
    finally:
        api.set_threads(before)
