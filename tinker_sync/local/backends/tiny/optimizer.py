"""AdamW with global-norm gradient clipping, over a dict of numpy arrays.

Usage::

    opt = AdamW(params)                       # moments start at zero
    metrics = opt.step(params, grads, parse_adam_params({"learning_rate": 1e-2}))

Per parameter ``p`` with gradient ``g`` (after clipping), at step ``t``::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g**2
    p = p * (1 - lr * weight_decay)                                  # decoupled decay
    p = p - lr * (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps)

Clipping: when ``grad_clip_norm > 0`` and the global L2 norm of all gradients exceeds it, every
gradient is scaled by ``grad_clip_norm / norm``.

Thread safety: not thread-safe (one training model, one thread). Fork safety: plain data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

Params = dict[str, npt.NDArray[np.floating]]


def global_norm(grads: Mapping[str, npt.NDArray[np.floating]]) -> float:
    """L2 norm of all arrays together (accumulated in float64)."""
    total = 0.0
    for g in grads.values():
        g64 = g.astype(np.float64, copy=False).ravel()
        total += float(g64 @ g64)
    return math.sqrt(total)


class AdamW:
    """AdamW state (first/second moments and the step count) for a fixed set of arrays.

    Thread safety: not thread-safe; owned by one model. Fork safety: plain data.
    """

    def __init__(self, params: Mapping[str, npt.NDArray[np.floating]]) -> None:
        self.m: Params = {k: np.zeros_like(v) for k, v in params.items()}
        self.v: Params = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(
        self, params: Params, grads: Mapping[str, npt.NDArray[np.floating]], hp: Mapping[str, float]
    ) -> dict[str, float]:
        """Update ``params`` in place from ``grads``; ``hp`` holds every ``AdamParams`` field.

        Returns ``grad_norm`` (before clipping) and the applied clip factor.
        """
        norm = global_norm(grads)
        clip = hp["grad_clip_norm"]
        factor = clip / norm if clip > 0 and norm > clip else 1.0
        self.t += 1
        lr, b1, b2, eps = hp["learning_rate"], hp["beta1"], hp["beta2"], hp["eps"]
        decay = 1.0 - lr * hp["weight_decay"]
        bc1 = 1.0 - b1**self.t
        bc2 = 1.0 - b2**self.t
        for key, p in params.items():
            g = grads[key] * factor if factor != 1.0 else grads[key]
            m, v = self.m[key], self.v[key]
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * (g * g)
            if decay != 1.0:
                np.multiply(p, decay, out=p)
            np.subtract(p, (lr / bc1) * m / (np.sqrt(v / bc2) + eps), out=p)
        return {"grad_norm": norm, "clip_factor": factor}
