"""The memory estimate a spec is admitted by (worker/memory.py): its arithmetic to the byte, the optimizer
state it counts against the real optimizers, and its total against the peak resident memory of real runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from worker.config import TrainConfig
from worker.memory import HOST_RUNTIME_CPU, estimate_memory, state_tensors
from worker.names import OPTIMIZERS


def nano(resources: dict[str, object] | None = None, **overrides: object) -> TrainConfig:
    cfg: dict[str, object] = {
        "model": {"preset": "gpt2-nano", "seq_len": 32},
        "data": {"vocab_size": 512},
        "optimizer": {"name": "adamw"},
        "evaluation": {"tokens": 4096},
        "resources": {"max_micro_batch": 4} | (resources or {}),
        "batch_size": 8,
        "token_budget": 2560,
    }
    return TrainConfig.model_validate(cfg | overrides)


def test_each_part_to_the_byte() -> None:
    # N = 2 layers x (12 x 64^2 + 13 x 64) + (512 + 32) x 64 + 2 x 64 = 134,912 parameters
    e = estimate_memory(nano())
    assert (e.weights, e.gradients, e.optimizer_state) == (539_648, 539_648, 1_079_296)  # 4N, 4N, 2 x 4N
    assert e.micro_batch == 4  # 8 sequences in micro-batches of at most 4
    assert e.activations == 4 * 32 * 2 * 36 * 64 * 4  # m T L x 36 d x 4 bytes = 2,359,296
    assert e.logits == 4 * 32 * 512 * 4 * 4  # m T V x 4 bytes x (logits, log-softmax, their gradients) = 1,048,576
    assert e.evaluation == 4 * 32 * 512 * 4 * 2  # max_micro_batch sequences, no gradient = 524,288
    assert e.host_bytes == int(HOST_RUNTIME_CPU) + 539_648 * 4 + 2_359_296 + 1_048_576
    assert e.device_bytes == 0


def test_bf16_halves_the_activations_only_and_a_gpu_holds_the_model() -> None:
    fp32, bf16 = estimate_memory(nano()), estimate_memory(nano(precision="bf16"))
    assert bf16.activations * 2 == fp32.activations and bf16.logits == fp32.logits and bf16.model == fp32.model
    gpu = estimate_memory(nano({"gpus_per_worker": 1}))
    assert gpu.device_bytes == gpu.runtime_device + gpu.model + gpu.activations + gpu.logits
    assert gpu.host_bytes == gpu.runtime_host + gpu.weights  # the weights are built on the host first


def test_evaluation_outgrows_training_when_its_micro_batch_is_larger() -> None:
    # batch 2: training micro-batch 2, evaluation at max_micro_batch 64 (4096 tokens = 128 windows of 32)
    e = estimate_memory(nano({"max_micro_batch": 64}, batch_size=2))
    assert e.evaluation == 64 * 32 * 512 * 4 * 2 > e.activations + e.logits
    assert e.working == e.model + e.evaluation


def test_lion_keeps_one_state_tensor_and_amsgrad_one_more() -> None:
    assert state_tensors("lion") == 1 and state_tensors("adamw") == 2
    assert state_tensors("adamw", {"amsgrad": True}) == 3


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_registry_counts_the_state_each_real_optimizer_keeps(name: str) -> None:
    from worker.config import OptimizerConfig
    from worker.optim import build_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = build_optimizer(OptimizerConfig(name=name, lr=1e-3), model, tokens_per_step=64)
    model(torch.randn(3, 8)).square().mean().backward()
    opt.step()
    if OPTIMIZERS[name].needs_hessian:
        opt.update_hessian()  # type: ignore[attr-defined]
    for p in model.parameters():
        same_shape = [v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.shape == p.shape]
        assert len(same_shape) == state_tensors(name), (name, list(opt.state[p]))


MEASURE = """
import json, resource, sys
from worker.config import TrainConfig
from worker.loop import train
from worker.session import LocalSession
import ray  # a trial's process holds Ray's worker runtime too
cfg = TrainConfig.model_validate_json(sys.argv[1])
train(cfg, LocalSession())
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


SHAPES = {
    "micro-T256-m32": {"model": {"preset": "gpt2-micro", "seq_len": 256}, "batch_size": 32, "max_micro_batch": 32},
    "nano-T128-m64": {"model": {"preset": "gpt2-nano", "seq_len": 128}, "batch_size": 64, "max_micro_batch": 64},
}


@pytest.mark.slow
def test_the_estimate_is_within_a_quarter_of_a_real_run_s_peak_memory() -> None:
    """Two steps and two evaluations of a real run in a fresh process for each shape: its peak resident memory,
    against the estimate (which must neither admit a run that cannot fit nor refuse one that can by much). The
    runs go side by side (one thread each; a process's peak is its own). The tokens are cached first, as a
    sweep's driver does before its trials (tokenising is no part of a trial's memory)."""
    from worker.data import prepare_data

    configs = {
        name: TrainConfig.model_validate(
            {"data": {"vocab_size": 4096}, "optimizer": {"name": "adamw", "lr": 1e-3}}
            | {"model": shape["model"], "batch_size": shape["batch_size"]}
            | {"resources": {"cpus_per_worker": 1, "max_micro_batch": shape["max_micro_batch"]}}
            | {"token_budget": 2 * int(shape["batch_size"]) * shape["model"]["seq_len"]}  # type: ignore[index]
        )
        for name, shape in SHAPES.items()
    }
    prepare_data(next(iter(configs.values())).data)
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-c", MEASURE, cfg.model_dump_json()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, cfg in configs.items()
    }
    ratios = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, stderr[-3000:])
        peak = json.loads(stdout.strip().splitlines()[-1])["peak"]
        ratios[name] = (estimate_memory(configs[name]).host_bytes / peak, peak / 2**20)
    assert all(0.8 <= ratio <= 1.25 for ratio, _ in ratios.values()), ratios
