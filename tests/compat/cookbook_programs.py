"""tinker-cookbook 0.6.1 loops, run as real programs against a local server (tiny backend).

Usage (the test module runs it; by hand)::

    python tests/compat/cookbook_programs.py sl,sl_resume WORKDIR     # the official `tinker`
    tinker-sync exec -- python tests/compat/cookbook_programs.py sl WORKDIR   # tinker_sync

``TINKER_BASE_URL`` / ``TINKER_API_KEY`` name the server. Prints one JSON line per capability:
``{"capability": ..., "sdk": "tinker" | "tinker_sync", "seconds": ..., "trace": [...]}`` where
``trace`` holds the loop's logged metrics per step (timings left out) and ``seconds`` the
capability's wall time in this process (imports excluded).
This file says ``import tinker`` like any cookbook program: it never names tinker_sync, so the
alias decides which SDK runs. Offline: a byte tokenizer is registered for ``tinker-sync/tiny``
(no model hub) and the pricing download is skipped.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import chz
import tinker
from tinker_cookbook import tokenizer_utils
from tinker_cookbook.utils import cost_estimation

MODEL = "tinker-sync/tiny"
RENDERER = "role_colon"


class ByteTokenizer:
    """The tiny model's vocabulary: ids 0..255 are UTF-8 bytes, 256 is EOS (no BOS)."""

    name_or_path = MODEL
    eos_token = "<|endoftext|>"
    eos_token_id = 256
    bos_token: str | None = None
    bos_token_id: int | None = None
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size


# At import, so spawn workers (which import this module) have it too.
tokenizer_utils.register_tokenizer(MODEL, ByteTokenizer)
cost_estimation._pricing_fetched = True  # offline: no pricing download (token counts only)

QA = [
    ("What color is the sky?", "blue"),
    ("What color is grass?", "green"),
    ("What color is snow?", "white"),
    ("What color is coal?", "black"),
    ("What color is a banana?", "yellow"),
    ("What color is a tomato?", "red"),
    ("What color is the sea?", "blue"),
    ("What color is an orange?", "orange"),
]


def conversations() -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in QA]


def sdk_name() -> str:
    return str(tinker.__name__)


def read_metrics(log_path: str) -> list[dict[str, Any]]:
    """The numeric metrics the loop logged, per step, without timings (they never repeat)."""
    path = Path(log_path) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        {
            k: v
            for k, v in row.items()
            if isinstance(v, (int, float)) and "time" not in k and not k.startswith("progress")
        }
        for row in rows
    ]


def forget_final_checkpoint(log_path: str) -> None:
    """Make the run look interrupted after its last periodic checkpoint (resume continues it)."""
    path = Path(log_path) / "checkpoints.jsonl"
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if '"name": "final"' not in line]
        path.write_text("".join(line + "\n" for line in kept))


# ------------------------------------------------------------------------------------- SL


def _supervised() -> Any:
    from tinker_cookbook import renderers
    from tinker_cookbook.supervised.data import conversation_to_datum
    from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder

    class ListDataset(SupervisedDataset):
        def __init__(self, data: list[tinker.Datum], batch_size: int) -> None:
            self.data = data
            self.batch_size = batch_size

        def get_batch(self, index: int) -> list[tinker.Datum]:
            return self.data[index * self.batch_size : (index + 1) * self.batch_size]

        def __len__(self) -> int:
            return len(self.data) // self.batch_size

        def set_epoch(self, seed: int = 0) -> None:
            pass

    @chz.chz
    class ColorsBuilder(SupervisedDatasetBuilder):
        def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
            renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer(MODEL))
            data = [conversation_to_datum(c, renderer, max_length=64) for c in conversations()]
            return ListDataset(data[:6], 2), ListDataset(data[6:], 2)

    return ColorsBuilder


def run_sl(workdir: str, max_steps: int) -> list[dict[str, Any]]:
    """Supervised loop: checkpoints every step, both evaluator kinds, resume from log_path."""
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.nll_evaluator import NLLEvaluator, SamplerNLLEvaluator

    builder = _supervised()()

    def sampler_nll() -> Any:
        return SamplerNLLEvaluator.from_dataset(builder()[1], name="sampler_test")

    def training_nll() -> Any:
        return NLLEvaluator.from_dataset(builder()[1], name="test")

    log_path = str(Path(workdir) / "sl")
    forget_final_checkpoint(log_path)
    config = train.Config(
        log_path=log_path,
        model_name=MODEL,
        recipe_name="compat_sl",
        renderer_name=RENDERER,
        dataset_builder=builder,
        learning_rate=3e-3,
        lora_rank=4,
        num_epochs=2,
        save_every=1,
        eval_every=1,
        infrequent_eval_every=2,
        evaluator_builders=[sampler_nll],
        infrequent_evaluator_builders=[training_nll],
        max_steps=max_steps,
    )
    asyncio.run(train.main(config))
    return read_metrics(log_path)


def run_download(workdir: str) -> list[dict[str, Any]]:
    """weights.download of the SL run's final state: an age-encrypted export, decrypted."""
    import hashlib

    from tinker_cookbook import checkpoint_utils, weights

    record = checkpoint_utils.get_last_checkpoint(str(Path(workdir) / "sl"))
    assert record is not None, "run the sl capability first"
    out = Path(workdir) / "download"
    weights.download(tinker_path=record.state_path, output_dir=str(out))
    return [
        {"file": str(p.relative_to(out)), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(out.rglob("*"))
        if p.is_file()
    ]


# ------------------------------------------------------------------------------------ DPO


def run_dpo(workdir: str) -> list[dict[str, Any]]:
    """DPO loop on in-code comparisons (the reference model is the initial weights)."""
    import datasets
    from tinker_cookbook.preference import train_dpo
    from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
    from tinker_cookbook.preference.preference_datasets import ComparisonDatasetBuilder
    from tinker_cookbook.preference.types import Comparison, LabeledComparison
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    @chz.chz
    class ColorComparisons(ComparisonDatasetBuilder):
        def get_train_and_test_datasets(self) -> tuple[Any, Any]:
            rows = [{"q": q, "good": a, "bad": "purple"} for q, a in QA]
            return datasets.Dataset.from_list(rows), None

        def example_to_labeled_comparison(self, example: dict[str, str]) -> Any:
            return LabeledComparison(
                comparison=Comparison(
                    prompt_conversation=[{"role": "user", "content": example["q"]}],
                    completion_A=[{"role": "assistant", "content": example["good"]}],
                    completion_B=[{"role": "assistant", "content": example["bad"]}],
                ),
                label="A",
            )

    log_path = str(Path(workdir) / "dpo")
    config = train_dpo.Config(
        log_path=log_path,
        model_name=MODEL,
        recipe_name="compat_dpo",
        renderer_name=RENDERER,
        dataset_builder=DPODatasetBuilderFromComparisons(
            comparison_builder=ColorComparisons(),
            common_config=ChatDatasetBuilderCommonConfig(
                model_name_for_tokenizer=MODEL,
                renderer_name=RENDERER,
                max_length=64,
                batch_size=2,
            ),
        ),
        learning_rate=3e-3,
        lora_rank=4,
        dpo_beta=0.1,
        save_every=2,
        max_steps=3,
    )
    train_dpo.main(config)
    return read_metrics(log_path)


# ------------------------------------------------------------------------------------- RL


class ColorEnvFactory:
    """Picklable thunk for one color question (rollouts may run in spawn workers)."""

    def __init__(self, question: str, answer: str) -> None:
        self.question = question
        self.answer = answer

    def __call__(self) -> Any:
        from tinker_cookbook import renderers
        from tinker_cookbook.rl.problem_env import ProblemEnv

        question, answer = self.question, self.answer

        class ColorEnv(ProblemEnv):
            def get_question(self) -> str:
                return question

            def check_answer(self, sample_str: str) -> bool:
                # The untrained tiny model answers noise: a parity of its bytes gives groups
                # mixed rewards (non-zero advantages), the right answer a sure reward.
                return answer in sample_str or sum(sample_str.encode()) % 2 == 0

            def check_format(self, sample_str: str) -> bool:
                return True

            def get_reference_answer(self) -> str:
                return answer

        renderer = renderers.get_renderer(RENDERER, tokenizer_utils.get_tokenizer(MODEL))
        return ColorEnv(renderer, require_stop_sequence_for_format=False)


def _rl_dataset_builder(groups_per_batch: int, group_size: int) -> Any:
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder

    class ColorDataset(RLDataset):
        def __init__(self) -> None:
            self.builders = [
                ProblemGroupBuilder(
                    env_thunk=ColorEnvFactory(q, a), num_envs=group_size, dataset_name="colors"
                )
                for q, a in QA
            ]

        def get_batch(self, index: int) -> list[Any]:
            start = (index * groups_per_batch) % len(self.builders)
            return [
                self.builders[(start + i) % len(self.builders)] for i in range(groups_per_batch)
            ]

        def __len__(self) -> int:
            return 4

    @chz.chz
    class ColorRLBuilder(RLDatasetBuilder):
        async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
            return ColorDataset(), None

    return ColorRLBuilder()


def run_rl(workdir: str, mode: str, max_steps: int = 2) -> list[dict[str, Any]]:
    """RL loop: sync, async off-policy, stream-minibatch, KL penalty; resume on a second run."""
    from tinker_cookbook.rl import train

    extra: dict[str, Any] = {}
    if mode == "async":
        extra["async_config"] = train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=2)
    elif mode == "stream":
        extra["stream_minibatch_config"] = train.StreamMinibatchConfig(
            groups_per_batch=2, num_minibatches=2
        )
    elif mode == "kl":
        extra["kl_penalty_coef"] = 0.1
        extra["kl_reference_config"] = train.KLReferenceConfig(base_model=MODEL)
    log_path = str(Path(workdir) / f"rl_{mode}")
    forget_final_checkpoint(log_path)
    config = train.Config(
        learning_rate=3e-3,
        dataset_builder=_rl_dataset_builder(2, 2),
        model_name=MODEL,
        recipe_name=f"compat_rl_{mode}",
        max_tokens=8,
        log_path=log_path,
        renderer_name=RENDERER,
        lora_rank=4,
        eval_every=0,
        save_every=1,
        max_steps=max_steps,
        **extra,
    )
    asyncio.run(train.main(config))
    return read_metrics(log_path)


def run_rl_spawn(workdir: str) -> list[dict[str, Any]]:
    """The sync RL loop with rollouts in a spawn ProcessPoolExecutor."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tinker_cookbook.rl.rollouts import set_rollout_executor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        set_rollout_executor(pool)
        try:
            return run_rl(workdir, "spawn", max_steps=1)
        finally:
            set_rollout_executor(None)


def warm_up(workdir: str) -> list[dict[str, Any]]:
    """Pay the one-time costs (imports, first session) so later timings are per loop."""
    import tinker_cookbook.preference.train_dpo
    import tinker_cookbook.rl.train
    import tinker_cookbook.supervised.train  # noqa: F401

    with tinker.ServiceClient() as service:
        service.create_lora_training_client(MODEL, rank=4).result()
    return []


CAPABILITIES: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "warmup": warm_up,
    "sl": lambda workdir: run_sl(workdir, 2),
    "sl_resume": lambda workdir: run_sl(workdir, 4),
    "dpo": run_dpo,
    "download": run_download,
    "rl_sync": lambda workdir: run_rl(workdir, "sync"),
    "rl_sync_resume": lambda workdir: run_rl(workdir, "sync", max_steps=3),
    "rl_async": lambda workdir: run_rl(workdir, "async"),
    "rl_stream": lambda workdir: run_rl(workdir, "stream"),
    "rl_kl": lambda workdir: run_rl(workdir, "kl"),
    "rl_spawn": run_rl_spawn,
}


def main(argv: list[str]) -> int:
    """``CAPABILITY[,CAPABILITY...] WORKDIR``: run each in turn (one process, one import)."""
    names, workdir = argv
    for capability in names.split(","):
        started = time.perf_counter()
        trace = CAPABILITIES[capability](workdir)
        seconds = time.perf_counter() - started
        record = {"capability": capability, "sdk": sdk_name(), "seconds": seconds, "trace": trace}
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
