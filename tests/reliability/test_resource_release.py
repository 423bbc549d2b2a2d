"""``close()`` gives back what the client opened (docs/design/behavior.md#close), without waiting
for the garbage collector.

The soak test (``test_soak.py``) checks the same at scale; this is the quick, focused version.
"""

from __future__ import annotations

import gc
import secrets

from reliability_helpers import HANG, fd_targets, open_fds, prompt, wait_all

import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer


def sample_through(server: LocalServer, faults: list[str], n: int = 60) -> set[int]:
    """Run ``n`` samples with ``faults`` installed, close the client; return the new fds."""
    base = open_fds()
    service = tinker_sync.ServiceClient(base_url=server.url, api_key="tml-" + secrets.token_hex(20))
    sampler = service.create_sampling_client(base_model="base")
    server.faults.extend(faults)
    futures = [sampler.sample(prompt(i), 1, types.SamplingParams(max_tokens=2)) for i in range(n)]
    wait_all(futures, HANG)
    assert all(f.exception(0) is None for f in futures)
    server.faults.clear()
    service.close()
    return open_fds() - base


def test_close_releases_sockets_after_a_clean_run() -> None:
    with LocalServer(long_poll_s=1.0, api_key=None, in_subprocess=True) as server:
        gc.disable()  # nothing may depend on a collection
        try:
            left = sample_through(server, [])
        finally:
            gc.enable()
    assert not left, fd_targets(left)


def test_close_releases_sockets_after_lost_replies() -> None:
    """A dropped connection (the server acted, the reply was lost) is retried and succeeds;
    afterwards ``close()`` must still close every keep-alive socket of the client."""
    with LocalServer(long_poll_s=1.0, api_key=None, in_subprocess=True) as server:
        gc.disable()
        try:
            left = sample_through(server, ["asample drop-after x1 after=3"])
        finally:
            gc.enable()
    assert not left, f"{len(left)} fds still open after close(): {fd_targets(left)}"


def test_close_fails_pending_futures_promptly() -> None:
    """Futures still pending at close() fail with ClientClosedError (NOT_SENT), at once --
    here while the server holds every poll (paused queues) so nothing could complete.

    See docs/design/behavior.md#close.
    """
    from tinker_sync.exceptions import ClientClosedError, RequestOutcome

    with LocalServer(long_poll_s=1.0, api_key=None) as server:
        service = tinker_sync.ServiceClient(
            base_url=server.url, api_key="tml-" + secrets.token_hex(20)
        )
        training = service.create_lora_training_client("base", rank=4)
        sampler = service.create_sampling_client(base_model="base")
        server.pause("paused_capacity")
        futures = [
            sampler.sample(prompt(i), 1, types.SamplingParams(max_tokens=2)) for i in range(20)
        ]
        futures += [training.optim_step(types.AdamParams()) for _ in range(3)]
        server.requests.wait_for("retrieve_future", count=5, timeout=HANG)
        assert not any(f.done() for f in futures)
        service.close()
        wait_all(futures, 5.0)  # promptly, not after a poll or retry budget
        server.resume()
    for fut in futures:
        exc = fut.exception(0)
        assert isinstance(exc, ClientClosedError), repr(exc)
        assert exc.outcome is RequestOutcome.NOT_SENT
