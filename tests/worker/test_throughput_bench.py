"""benchmarks/train_throughput.py in a tiny configuration: it runs both loops and prints what it promises, in
the shape deploy/gpu_check.sh reads (its numbers are not checked here: speed is the benchmark's business)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from bench_helpers import load_bench

SHAPE = ["--preset", "gpt2-nano", "--seq-len", "32", "--batch-size", "4", "--max-micro-batch", "2", "--threads", "1"]
TINY = [*SHAPE, "--steps", "4", "--warmup", "1", "--rounds", "2"]
# the lines deploy/gpu_check.sh reads, as its sed expressions match them
LOOP_LINE = re.compile(r"^loop \(worker\.loop\.train, default metrics\): [\d,]+ tokens/s, MFU (\d+\.\d)%$")
RATIO_LINE = re.compile(r"^loop / bare = (\d+\.\d{3}) \(target >= 0\.95\)$")


@pytest.fixture(autouse=True)
def _cache(token_cache: Path) -> Iterator[None]:
    """The benchmark reads the built-in corpus through the session's token cache; its --threads is put back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_benchmark_prints_both_loops_mfu_and_the_ratio_last(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BATCHSWEEP_PEAK_TFLOPS", "1.5")  # a peak, so that MFU is printed as on a known GPU
    bench = load_bench("train_throughput")
    assert bench.main(TINY) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("gpt2-nano: ") and "micro 2 x accumulation 2" in lines[0]
    rounds = [line for line in lines if line.startswith("  round ")]
    assert len(rounds) == 2 and all(re.search(r"loop [\d,]+ tokens/s, bare [\d,]+ tokens/s, ratio", r) for r in rounds)
    (loop_line,) = [line for line in lines if line.startswith("loop (")]
    loop_mfu = LOOP_LINE.match(loop_line)
    assert loop_mfu and float(loop_mfu.group(1)) > 0
    assert any(re.match(r"^bare PyTorch loop: +[\d,]+ tokens/s, MFU \d+\.\d%$", line) for line in lines)
    # both evaluations of each timed loop run (2 rounds; the untimed warm-up round's are not counted) are
    # accounted for, and left out of its time
    assert any(line.startswith("excluded from the loop's time: 4 evaluations") for line in lines)
    ratio = RATIO_LINE.match(lines[-1])
    assert ratio and float(ratio.group(1)) > 0


def test_without_a_known_peak_it_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("BATCHSWEEP_PEAK_TFLOPS", raising=False)
    bench = load_bench("train_throughput")
    assert bench.main([*SHAPE, "--steps", "2", "--warmup", "1", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "MFU n/a" in out and "MFU: no peak FLOP/s known for cpu; $BATCHSWEEP_PEAK_TFLOPS sets one" in out
    assert RATIO_LINE.match(out.strip().splitlines()[-1])


def test_the_benchmark_refuses_what_it_cannot_compare() -> None:
    bench = load_bench("train_throughput")
    with pytest.raises(SystemExit):
        bench.main([*TINY, "--optimizer", "sophia"])  # the bare loop has no Hessian pass
    with pytest.raises(SystemExit):
        bench.main([*SHAPE, "--steps", "2", "--warmup", "2"])
