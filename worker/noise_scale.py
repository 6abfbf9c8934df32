"""Gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix A).

Two gradient norms of one step, at two batch sizes, give unbiased estimates of |G|^2 and tr(Sigma):
  |G|^2   ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
  tr(S)   ~ (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big)
Both are noisy, so each is smoothed by an EMA before the ratio is taken. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass


def noise_scale_estimates(g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) estimates from squared gradient norms at batch sizes b_small < b_big."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


@dataclass
class NoiseScaleEMA:
    """EMA of both estimates; `value` is B_simple in the units of the batch sizes given (sequences)."""

    decay: float = 0.9
    g2: float | None = None
    trace: float | None = None

    def update(self, g_small_sq: float, g_big_sq: float, b_small: float, b_big: float) -> float | None:
        g2, trace = noise_scale_estimates(g_small_sq, g_big_sq, b_small, b_big)
        if self.g2 is None or self.trace is None:
            self.g2, self.trace = g2, trace
        else:
            self.g2 = self.decay * self.g2 + (1 - self.decay) * g2
            self.trace = self.decay * self.trace + (1 - self.decay) * trace
        return self.value

    @property
    def value(self) -> float | None:
        # either estimate can come out <= 0 while noise dominates: no estimate then, not a negative one
        if self.g2 is None or self.trace is None or self.g2 <= 0 or self.trace <= 0:
            return None
        return self.trace / self.g2
