import pytest

from worker.noise_scale import NoiseScaleEMA, noise_scale_estimates


def test_estimates_recover_known_gradient_and_noise() -> None:
    # E|g_B|^2 = |G|^2 + tr(S)/B. With |G|^2 = 2 and tr(S) = 40: B=4 -> 12, B=20 -> 4
    g2, trace = noise_scale_estimates(12.0, 4.0, 4, 20)
    assert g2 == pytest.approx(2.0)
    assert trace == pytest.approx(40.0)


def test_ema_smooths_both_estimates_before_the_ratio() -> None:
    ema = NoiseScaleEMA(decay=0.5)
    assert ema.update(12.0, 4.0, 4, 20) == pytest.approx(20.0)  # B_simple = 40 / 2
    # second sample: |G|^2 = (20*6 - 4*14)/16 = 4, tr(S) = (14-6)/(1/4-1/20) = 40
    ema.update(14.0, 6.0, 4, 20)
    # ratio of EMAs (0.5*40+0.5*40) / (0.5*2+0.5*4) = 40/3, not the mean of ratios (15)
    assert ema.value == pytest.approx(40.0 / 3.0)


def test_no_value_while_gradient_estimate_is_not_positive() -> None:
    ema = NoiseScaleEMA()
    ema.update(1.0, 3.0, 4, 20)  # |G|^2 = (60 - 4)/16 > 0 but tr(S) = -10 < 0: no estimate
    assert ema.value is None
    # sample |G|^2 = (60 - 164)/16 = -6.5, tr(S) = 38/0.2 = 190; EMAs: 0.9*3.5 + 0.1*-6.5 = 2.5 and
    # 0.9*-10 + 0.1*190 = 10, both positive again: B_simple = 10 / 2.5
    ema.update(41.0, 3.0, 4, 20)
    assert ema.value == pytest.approx(4.0)
    ema2 = NoiseScaleEMA()
    ema2.update(30.0, 1.0, 4, 20)  # |G|^2 = (20 - 120)/16 < 0: noise dominates, no estimate
    assert ema2.value is None


def test_batch_sizes_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="b_small=8, b_big=8"):
        noise_scale_estimates(1.0, 1.0, 8, 8)
