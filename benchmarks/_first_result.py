"""P8: time to a first result in a fresh interpreter, as a user's script sees it.

Usage: ``python _first_result.py ours|official URL KEY PROMPT_LEN MAX_TOKENS``; prints the seconds
from before ``import`` to the first sample in hand: import the SDK, create a ``ServiceClient``,
create a sampling client, sample once and wait for the result. The interpreter's own start-up
is excluded (the clock starts at the first line). Exits at once after printing, so background
threads' shutdown is not counted.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402


def main() -> None:
    label, url, key, prompt_len, max_tokens = sys.argv[1:6]
    warnings.simplefilter("ignore")
    if label == "ours":
        import tinker_sync as sdk
    else:
        import tinker as sdk  # type: ignore[no-redef]
    service = sdk.ServiceClient(base_url=url, api_key=key)
    sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
    if type(sampler).__name__.startswith("Backcompat") and hasattr(sampler, "result"):
        sampler = sampler.result()
    tokens = [(i * 7 + 3) % 256 for i in range(int(prompt_len))]
    result = sampler.sample(
        prompt=sdk.ModelInput.from_ints(tokens),
        num_samples=1,
        sampling_params=sdk.SamplingParams(max_tokens=int(max_tokens)),
    ).result()
    elapsed = time.perf_counter() - T0
    if not result.sequences[0].tokens:
        raise SystemExit("empty sample")
    sys.stdout.write(f"{elapsed!r}\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
