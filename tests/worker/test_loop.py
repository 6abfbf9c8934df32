"""The training loop in-process (LocalSession): same code as on Ray, no cluster needed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from worker.config import EvalConfig, ModelConfig, OptimizerConfig, ResourcesConfig, TrainConfig, split_batch
from worker.data import prepare_data, val_windows
from worker.loop import Layout, evaluate, train
from worker.model import build_model
from worker.names import OPTIMIZER_NAMES
from worker.optim import build_optimizer
from worker.session import LocalSession, run_result

TINY = dict(model=ModelConfig(preset="gpt2-nano", seq_len=32), resources={"max_micro_batch": 4, "cpus_per_worker": 1})


def cfg(**kw: object) -> TrainConfig:
    """The tiny run with `kw`: a top-level field replaced, or a section given as a dict updated field by field."""
    base: dict = dict(
        TINY, batch_size=8, token_budget=8 * 32 * 24, evaluation={"every_tokens": 8 * 32 * 6, "tokens": 256}
    )
    for key, value in kw.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        base[key] = base[key] | value if both else value
    return TrainConfig(**base)


@pytest.fixture(autouse=True)
def _cache(token_cache: Path) -> None:
    """All loop tests share the session's token cache of the built-in corpus."""


def test_loss_goes_down_and_reports_line_up_on_tokens() -> None:
    session = LocalSession()
    final = train(cfg(optimizer=OptimizerConfig(name="adamw", lr=1e-2)), session)
    assert final["status"] == "completed"
    tokens = [r["tokens"] for r in session.reports]
    # reports every evaluation.every_tokens, step axis in tokens (4 evals of 6 steps x 256 tokens)
    assert tokens == [1536, 3072, 4608, 6144]
    assert session.reports[-1]["val_loss"] < session.reports[0]["val_loss"]
    assert session.reports[-1]["done"] is True and all(not r["done"] for r in session.reports[:-1])
    for key in (
        "train_loss",
        "lr",
        "tokens_per_s",
        "grad_norm",
        "attn_logit_max",
        "attn_logit_max/layer_0",
        "attn_logit_max/layer_1",
        "noise_scale",
        "train_time_s",
    ):
        assert key in final, key
    # accumulation 2 x micro 4: the noise scale is measured, and is a positive number of sequences
    assert final["noise_scale"] > 0


def test_same_seed_same_run_other_seed_other_run() -> None:
    a = train(cfg(token_budget=8 * 32 * 6, evaluation={"every_tokens": 8 * 32 * 6}), LocalSession())
    b = train(cfg(token_budget=8 * 32 * 6, evaluation={"every_tokens": 8 * 32 * 6}), LocalSession())
    c = train(cfg(token_budget=8 * 32 * 6, evaluation={"every_tokens": 8 * 32 * 6}, seed=1), LocalSession())
    assert a["val_loss"] == b["val_loss"]
    assert a["val_loss"] != c["val_loss"]


def test_absurd_lr_is_reported_as_diverged_not_raised() -> None:
    session = LocalSession()
    final = train(cfg(optimizer=OptimizerConfig(name="adamw", lr=1e4), grad_clip=None), session)
    assert final["status"] == "diverged"
    assert final["done"] is True
    # the run stopped early: it did not spend its budget
    assert final["tokens"] < 8 * 32 * 24
    assert session.reports[-1]["status"] == "diverged"


def test_a_run_that_diverges_before_its_first_evaluation_reports_the_metric_as_nan() -> None:
    # Tune checks every result for its metric (a result without it ends the whole sweep): a run that
    # diverges in its first steps, before any evaluation, still reports val_loss, NaN, and where it stopped
    c = cfg(optimizer=OptimizerConfig(name="adamw", lr=1e4), grad_clip=None, evaluation={"every_tokens": 8 * 32 * 24})
    session = LocalSession()
    final = train(c, session)
    assert session.reports == [final] and final["status"] == "diverged" and final["done"] is True
    assert "val_loss" in final and math.isnan(final["val_loss"])
    assert 0 < final["tokens"] < c.token_budget and final["tokens"] == final["step"] * c.tokens_per_step


def test_run_result_names_the_bad_status_and_always_carries_the_metric() -> None:
    assert math.isnan(run_result({}, tokens=0, step=0, status="running")["val_loss"])
    kept = run_result({"val_loss": 2.0, "lr": 1e-3}, tokens=64, step=1, status="completed", train_time_s=1.5)
    assert kept == {
        "val_loss": 2.0,
        "lr": 1e-3,
        "tokens": 64,
        "step": 1,
        "status": "completed",
        "done": True,
        "train_time_s": 1.5,
    }
    gone = run_result({"val_loss": 2.0, "lr": 1e-3}, tokens=96, step=2, status="diverged")
    assert math.isnan(gone["val_loss"]) and gone["lr"] == 1e-3 and gone["done"] is True
    with pytest.raises(ValueError, match="status='pruned'"):
        run_result({}, tokens=0, step=0, status="pruned")


# lr per optimizer: the lowest mean final val loss of a small grid (seeds 0-4, this config) among
#   adamw 3e-3 / 1e-2 / 3e-2: 6.816 / 6.859 / 6.863     lamb 1e-2 / 3e-2: 7.331 / 6.834
#   lion 1e-3 / 3e-3: 6.927 / 6.788                     merit 1e-2 / 3e-2: 6.985 / 6.761
#   sophia 1e-3 / 3e-3 / 1e-2: 7.050 / 6.886 / 7.068
LEARNING_LR = {"adamw": 3e-3, "lamb": 3e-2, "lion": 3e-3, "merit": 3e-2, "sophia": 3e-3}
LEARNING_STEPS = 60  # x 8 sequences x 32 tokens = 15,360 tokens; about 1.3 s a run on one thread
# Measured at those lrs (seeds 0-7, val loss in nats per token over the 2,048-token held-out set):
#   untrained model   8.310 +- 0.003  (ln 4096 = 8.318)
#   after 60 steps    adamw 6.820 +- 0.030, lamb 6.836 +- 0.021, lion 6.790 +- 0.019,
#                     merit 6.762 +- 0.042, sophia 6.889 +- 0.028   (mean +- sd over the seeds)
#   smallest drop     1.37 (sophia), then 1.44 (adamw, lamb), 1.49 (lion), 1.50 (merit)
# A required drop of 1.0 nats is 24 seed-to-seed sds of the final loss (the largest, 0.042) and still 0.37
# nats (9 such sds) below the smallest drop seen. (The unigram cross-entropy of this held-out set is 6.69: at
# this length the models have learnt mostly the token frequencies, from a near-uniform 8.31.)
LEARNING_DROP = 1.0


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_every_optimizer_learns_through_the_loop(name: str) -> None:
    c = TrainConfig(
        model=ModelConfig(preset="gpt2-nano", seq_len=32),
        optimizer=OptimizerConfig(name=name, lr=LEARNING_LR[name]),
        batch_size=8,
        token_budget=8 * 32 * LEARNING_STEPS,
        evaluation=EvalConfig(every_tokens=8 * 32 * LEARNING_STEPS, tokens=2048),  # one eval, at the end
        resources=ResourcesConfig(max_micro_batch=8, cpus_per_worker=1),
    )
    # the val loss of the untrained model: the one train() builds (same seed), scored by the loop's evaluate()
    data = prepare_data(c.data)
    untrained = build_model(c.model, vocab_size=data.vocab_size, seed=c.seed)
    layout = Layout(torch.device("cpu"), rank=0, world_size=1, micro=8, accum=1)
    initial = evaluate(untrained, data, val_windows(data, seq_len=32, tokens=c.evaluation.tokens), cfg=c, layout=layout)
    assert initial["val_loss"] == pytest.approx(math.log(data.vocab_size), abs=0.05)  # a near-uniform start

    session = LocalSession()
    final = train(c, session)
    assert final["status"] == "completed" and final["step"] == LEARNING_STEPS
    drop = initial["val_loss"] - final["val_loss"]
    assert drop > LEARNING_DROP, f"{name}: val loss {initial['val_loss']:.3f} -> {final['val_loss']:.3f}"


def test_the_final_result_is_the_last_report() -> None:
    # one builder (worker.session.run_result) for every report and the result: completed and diverged alike
    for c in (cfg(), cfg(optimizer=OptimizerConfig(name="adamw", lr=1e4), grad_clip=None)):
        session = LocalSession()
        final = train(c, session)
        assert final == session.reports[-1]
        assert final["done"] is True and final["status"] in ("completed", "diverged")
        assert all(r["status"] == "running" and r["done"] is False for r in session.reports[:-1])
        # the report says where the run stands: a diverged run stopped between evals, before its budget
        assert final["tokens"] == final["step"] * c.tokens_per_step
    assert final["status"] == "diverged" and final["tokens"] < c.token_budget


def test_resume_from_checkpoint_continues_instead_of_restarting(tmp_path: Path) -> None:
    full = LocalSession()
    expected = train(cfg(), full)

    first = LocalSession(checkpoint_root=tmp_path)
    c = cfg(checkpoints={"every_tokens": None})  # at every evaluation
    train(c, first)
    second_ckpt = first.checkpoints[1]  # saved after the 2nd eval (step 12)
    resumed = LocalSession(resume_from=second_ckpt)
    final = train(c, resumed)
    # the resumed run reports only what comes after the checkpoint ...
    assert [r["tokens"] for r in resumed.reports] == [4608, 6144]
    # ... and ends where the uninterrupted run ended (same data order, optimizer state, schedule)
    assert final["val_loss"] == pytest.approx(expected["val_loss"], rel=1e-5)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_every_optimizers_checkpoint_loads_as_tensors_and_plain_values_only(name: str, tmp_path: Path) -> None:
    # checkpoints load with weights_only=True: every optimizer's state must be tensors and plain values
    session = LocalSession(checkpoint_root=tmp_path)
    train(cfg(optimizer=OptimizerConfig(name=name, lr=1e-3), token_budget=8 * 32 * 12), session)
    resumed = LocalSession(resume_from=session.checkpoints[0])
    assert train(cfg(optimizer=OptimizerConfig(name=name, lr=1e-3), token_budget=8 * 32 * 12), resumed)["status"] == (
        "completed"
    )
    assert [r["tokens"] for r in resumed.reports] == [3072]


class _Planted:
    def __reduce__(self) -> tuple:
        return (Path.touch, (Path(_PLANTED_MARK),))


_PLANTED_MARK = "/tmp/batchsweep-planted-checkpoint-ran"


def test_a_checkpoint_planted_in_the_trial_storage_cannot_run_code(tmp_path: Path) -> None:
    from worker.loop import CHECKPOINT_FILE, load_checkpoint

    mark = Path(_PLANTED_MARK)
    mark.unlink(missing_ok=True)
    torch.save({"model": _Planted()}, tmp_path / CHECKPOINT_FILE)
    c = cfg()
    model = build_model(c.model, vocab_size=300, seed=0)
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        load_checkpoint(
            tmp_path,
            model=model,
            optimizer=build_optimizer(c.optimizer, model, tokens_per_step=256),
            batches=None,
            device=torch.device("cpu"),
            noise=None,  # type: ignore[arg-type]
        )
    assert not mark.exists()


def test_attention_probe_matches_eager_attention() -> None:
    from worker.model import attention_logit_probe, build_model

    model = build_model(ModelConfig(preset="gpt2-nano", seq_len=16), vocab_size=300, seed=0)
    x = torch.randint(0, 300, (3, 16))
    with attention_logit_probe() as per_layer:
        model(x)
    # reference: the pre-softmax scores of eager attention, q.k/sqrt(d), causal max per layer
    expected = {}
    hidden = model.transformer.wte(x) + model.transformer.wpe(torch.arange(16))
    for i, block in enumerate(model.transformer.h):
        h = block.ln_1(hidden)
        q, k, _ = block.attn.c_attn(h).split(64, dim=2)
        q = q.view(3, 16, 2, 32).transpose(1, 2)
        k = k.view(3, 16, 2, 32).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(32)
        mask = torch.ones(16, 16, dtype=torch.bool).tril()
        expected[i] = scores.masked_fill(~mask, float("-inf")).amax().item()
        out = block(hidden)
        hidden = out[0] if isinstance(out, tuple) else out
    assert per_layer.keys() == expected.keys()
    for i in expected:
        assert per_layer[i] == pytest.approx(expected[i], rel=1e-5)


# ---- a trustworthy answer: a run is a function of its config ----------------------------------------

LR = {"adamw": 1e-2, "lamb": 1e-2, "lion": 1e-3, "merit": 1e-2, "sophia": 1e-3}


def curve(c: TrainConfig) -> list[tuple[int, float, float, float]]:
    session = LocalSession()
    train(c, session)
    return [(r["tokens"], r["train_loss"], r["val_loss"], r["grad_norm"]) for r in session.reports]


@pytest.mark.parametrize(
    ("name", "dropout"), [(name, 0.0) for name in OPTIMIZER_NAMES] + [("adamw", 0.1), ("sophia", 0.1)]
)
def test_a_trial_gives_the_same_curve_whatever_ran_before_it(name: str, dropout: float) -> None:
    # 12 steps: Sophia's Hessian pass (every 10th step) runs once; dropout draws at every forward pass
    trial = cfg(
        model=ModelConfig(preset="gpt2-nano", seq_len=32, dropout=dropout),
        optimizer=OptimizerConfig(name=name, lr=LR[name]),
        token_budget=8 * 32 * 12,
    )
    # another trial in between (Ray Tune's reuse_actors), and a draw from the global RNG
    other = cfg(
        model=ModelConfig(preset="gpt2-nano", seq_len=32, dropout=0.2),
        optimizer=OptimizerConfig(name="sophia" if name != "sophia" else "adamw", lr=1e-3),
        token_budget=8 * 32 * 12,
        seed=7,
    )
    first = curve(trial)
    curve(other)
    torch.rand(1000)
    second = curve(trial)
    assert len(first) == 2
    assert first == second  # bit for bit
    # and the seed does matter
    assert curve(trial.model_copy(update={"seed": 1}))[-1] != first[-1]


def sophia_hessian(tmp_path: Path, **kw: object) -> list[torch.Tensor]:
    """Sophia's Hessian estimate after its first update (step 10 of 20), from the checkpoint of that eval.

    lr=1e-12: every update is far below float32 resolution of the weights, so runs that split the batch
    differently reach the Hessian pass with the same model (up to ~1e-12 in the biases).
    """
    resources = {"max_micro_batch": kw.pop("max_micro_batch"), "cpus_per_worker": 1}
    base: dict = dict(
        TINY,
        batch_size=16,
        token_budget=16 * 32 * 20,
        evaluation={"every_tokens": 16 * 32 * 10, "tokens": 32},
        resources=resources,
        optimizer=OptimizerConfig(name="sophia", lr=1e-12),
    )
    session = LocalSession(checkpoint_root=tmp_path)
    c = TrainConfig(**(base | kw))
    train(c, session)
    state = torch.load(session.checkpoints[0] / "state.pt", weights_only=False)
    assert state["step"] == 10
    # the pass read the next step's batch without taking it: 10 steps took 10 x accumulation micro-batches
    _, accum = split_batch(c.batch_size, c.resources.workers_per_trial, c.resources.max_micro_batch)
    assert state["batches"]["position"] == 10 * accum
    return [s["hessian"] for s in state["optimizer"]["state"].values()]


def test_sophia_hessian_does_not_depend_on_the_micro_batch_split(tmp_path: Path) -> None:
    # the global batch of 16 sequences as 1 x 16, 2 x 8 and 4 x 4
    one, two, four = (sophia_hessian(tmp_path / str(m), max_micro_batch=m) for m in (16, 8, 4))
    assert sum(h.sum().item() for h in one) > 0
    for h1, h2, h4 in zip(one, two, four, strict=True):
        # float tolerance: h is a square of sums taken in another order (~1e-6 of each tensor's largest)
        tol = 1e-5 * h1.abs().max().item()
        torch.testing.assert_close(h2, h1, rtol=1e-4, atol=tol)
        torch.testing.assert_close(h4, h1, rtol=1e-4, atol=tol)


def test_sophia_clips_the_sampled_label_gradient_like_a_training_gradient(tmp_path: Path) -> None:
    # as the authors' train_sophiag.py: clip_grad_norm_ before update_hessian(), so from h = 0 the first
    # update is h = (1 - beta2) * g_clipped^2, whose sum is (1 - beta2) * grad_clip^2 once the norm exceeds it
    grad_clip, beta2 = 1e-3, 0.99
    hessians = sophia_hessian(tmp_path, max_micro_batch=8, grad_clip=grad_clip)
    assert sum(h.sum().item() for h in hessians) == pytest.approx((1 - beta2) * grad_clip**2, rel=1e-4)


def test_val_loss_does_not_depend_on_the_micro_batch_size() -> None:
    # the default held-out set, and lr=1e-12: both runs evaluate the same model, with accumulation 4 x 4
    # and 1 x 16
    finals = []
    for max_micro_batch in (4, 16):
        c = TrainConfig(
            model=ModelConfig(preset="gpt2-nano", seq_len=32),
            optimizer=OptimizerConfig(name="adamw", lr=1e-12),
            batch_size=16,
            token_budget=16 * 32 * 2,
            resources=ResourcesConfig(max_micro_batch=max_micro_batch, cpus_per_worker=1),
        )
        finals.append(train(c, LocalSession()))
    small, large = finals
    assert abs(small["val_loss"] - large["val_loss"]) < 1e-6
    for key in ("attn_logit_max", "attn_logit_max/layer_0", "attn_logit_max/layer_1"):
        assert small[key] == pytest.approx(large[key], rel=1e-6)


def test_eval_tokens_is_validated() -> None:
    with pytest.raises(ValueError, match=r"evaluation.tokens\n.*tokens must be > 0, got tokens=-1"):
        cfg(evaluation={"tokens": -1})
    with pytest.raises(ValueError, match=r"evaluation.tokens\n"):
        cfg(evaluation={"tokens": 10**9})


# ---- data-parallel: 2 ranks in 2 processes over gloo (what Ray Train sets up, without Ray) ------------

DDP_CFG = dict(
    model=ModelConfig(preset="gpt2-nano", seq_len=32),
    optimizer=OptimizerConfig(name="sophia", lr=1e-12),  # the same model everywhere (see sophia_hessian)
    batch_size=16,
    token_budget=16 * 32 * 11,
    evaluation=EvalConfig(every_tokens=16 * 32 * 10),
)
DDP_RESOURCES = {"max_micro_batch": 4, "cpus_per_worker": 1}


def _ddp_rank(rank: int, world_size: int, init_file: str, cfg_json: str, out: str) -> None:
    """One rank (a spawned process): the loop under a process group, as on a Ray Train worker."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        session = LocalSession(checkpoint_root=Path(out) if rank == 0 else None)
        session.world_rank, session.world_size = rank, world_size
        final = train(TrainConfig.model_validate_json(cfg_json), session)
        torch.save({"final": final, "reports": session.reports}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_evaluate_the_same_set_and_estimate_the_same_hessian_as_one(tmp_path: Path) -> None:
    import torch.multiprocessing as tmp_mp

    single = LocalSession(checkpoint_root=tmp_path / "single")
    (tmp_path / "single").mkdir()
    train(TrainConfig(**DDP_CFG, resources=DDP_RESOURCES), single)  # micro 4 x accumulation 4
    ddp_dir = tmp_path / "ddp"
    ddp_dir.mkdir()
    cfg_json = TrainConfig(
        **DDP_CFG, resources=DDP_RESOURCES | {"workers_per_trial": 2}
    ).model_dump_json()  # 2 ranks x micro 4 x accumulation 2
    tmp_mp.spawn(_ddp_rank, args=(2, str(tmp_path / "pg"), cfg_json, str(ddp_dir)), nprocs=2, join=True)
    ranks = [torch.load(ddp_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]

    assert ranks[0]["final"]["ranks_in_sync"] is True
    # the held-out set is sharded over the ranks and summed: both report the loss over the whole set,
    # the one a single worker reports
    for r in ranks:
        got = [m["val_loss"] for m in r["reports"]]
        want = [m["val_loss"] for m in single.reports]
        assert len(got) == len(want) == 2
        assert all(abs(a - b) < 1e-6 for a, b in zip(got, want, strict=True)), (got, want)
    # Sophia's Hessian pass: every rank's micro-batches, averaged over the ranks, the same labels
    (ckpt,) = [p for p in ddp_dir.iterdir() if p.name.startswith("checkpoint_")]
    hessians = [
        [s["hessian"] for s in torch.load(d / "state.pt", weights_only=False)["optimizer"]["state"].values()]
        for d in (single.checkpoints[0], ckpt)
    ]
    for h1, h2 in zip(*hessians, strict=True):
        torch.testing.assert_close(h2, h1, rtol=1e-4, atol=1e-5 * h1.abs().max().item())


# ---- the hardware's speed: bf16, compile, one host read per step, the probe off the training step ----------

# tests marked gpu run where CUDA is (deploy/gpu_check.sh: pytest -m gpu); elsewhere they say why they skip
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (deploy/gpu_check.sh runs it)")


def test_bf16_autocast_trains_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import worker.loop

    dtypes: set[torch.dtype] = set()
    build = worker.loop.build_model

    def spied(*args: object, **kw: object) -> torch.nn.Module:
        model = build(*args, **kw)  # type: ignore[arg-type]
        model.lm_head.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
        return model

    monkeypatch.setattr(worker.loop, "build_model", spied)
    session = LocalSession()
    final = train(cfg(optimizer=OptimizerConfig(name="adamw", lr=1e-2), precision="bf16"), session)
    assert final["status"] == "completed"
    assert dtypes == {torch.bfloat16}  # every forward pass (training, eval, probe) ran under bf16 autocast
    assert session.reports[-1]["val_loss"] < session.reports[0]["val_loss"]
    fp32 = train(cfg(optimizer=OptimizerConfig(name="adamw", lr=1e-2)), LocalSession())
    # the same run in bf16 is a different computation, but not a different answer
    assert final["val_loss"] == pytest.approx(fp32["val_loss"], rel=0.02)
    assert final["val_loss"] != fp32["val_loss"]


@pytest.mark.compile
def test_compiled_model_trains_like_the_eager_one_on_cpu() -> None:
    # inductor's C++ kernels (one compilation of the training graph, ~20 s on 2 cores cold)
    c = cfg(token_budget=8 * 32 * 4, evaluation={"every_tokens": 8 * 32 * 4})
    eager = train(c, LocalSession())
    compiled = train(c.model_copy(update={"compile": True}), LocalSession())
    assert compiled["status"] == "completed" and compiled["step"] == 4
    for key in ("train_loss", "val_loss", "grad_norm", "attn_logit_max"):
        assert compiled[key] == pytest.approx(eager[key], rel=1e-5), key


def test_a_training_step_reads_the_device_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # on CUDA every read (.item(), .tolist()) waits for the device: the step does one, for the divergence
    # check, which must come before the optimizer steps; counted here on CPU through the same calls. The
    # optimizer's own step is not counted: on CPU AdamW reads its (CPU) step counters; on CUDA it is the fused
    # kernel, and MERIT's and Sophia's steps are checked for syncs in tests/worker/test_optim_speed.py.
    import worker.loop

    reads: list[str] = []
    steps: list[int] = []
    in_optimizer = [False]
    for name in ("item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, _original=original, _name=name) -> object:  # noqa: ANN001
            if not in_optimizer[0]:
                reads.append(_name)
            return _original(self)

        monkeypatch.setattr(torch.Tensor, name, counted)
    build = worker.loop.build_optimizer

    def spied_build(*args: object, **kw: object) -> torch.optim.Optimizer:
        optimizer = build(*args, **kw)  # type: ignore[arg-type]
        optimizer_step = optimizer.step

        def step_uncounted(*a: object, **k: object) -> object:
            in_optimizer[0] = True
            try:
                return optimizer_step(*a, **k)
            finally:
                in_optimizer[0] = False

        optimizer.step = step_uncounted  # type: ignore[method-assign]
        return optimizer

    monkeypatch.setattr(worker.loop, "build_optimizer", spied_build)
    step = worker.loop.train_step

    def counted_step(*args: object, **kw: object) -> object:
        before = len(reads)
        out = step(*args, **kw)  # type: ignore[arg-type]
        steps.append(len(reads) - before)
        return out

    monkeypatch.setattr(worker.loop, "train_step", counted_step)
    train(cfg(token_budget=8 * 32 * 3, evaluation={"every_tokens": 8 * 32 * 3}), LocalSession())  # accumulation 2
    assert steps == [1, 1, 1]


def test_the_attention_probe_runs_at_eval_only_and_training_attention_is_flash_eligible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import worker.loop

    probes: list[int] = []
    probe = worker.loop.attention_logit_probe

    def counted_probe():  # noqa: ANN202
        probes.append(1)
        return probe()

    monkeypatch.setattr(worker.loop, "attention_logit_probe", counted_probe)
    calls: list[tuple[bool, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spied_sdpa(*args: object, **kw: object) -> torch.Tensor:
        calls.append((kw.get("attn_mask") is None, bool(kw.get("is_causal"))))
        return sdpa(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spied_sdpa)
    session = LocalSession()
    train(cfg(), session)
    assert len(probes) == len(session.reports) == 4  # once per eval, never in a training step
    # every attention call (training, eval) is SDPA with no mask and is_causal: the form flash attention takes
    assert calls and set(calls) == {(True, True)}


def test_adamw_takes_the_fused_kernel_on_cuda_unless_extra_chooses() -> None:
    # the rule is the optimizer table's (worker.names.OPTIMIZERS["adamw"].build_defaults)
    from worker.optim import optimizer_keywords

    def impl(cfg: OptimizerConfig, device_type: str) -> dict:
        kw = optimizer_keywords(cfg, device_type=device_type, tokens_per_step=1)
        return {k: kw[k] for k in ("fused", "foreach") if k in kw}

    adamw = OptimizerConfig(name="adamw", lr=1e-3)
    assert impl(adamw, "cuda") == {"fused": True}
    assert impl(adamw, "cpu") == {"foreach": True}
    for chosen, on_cuda in (
        ({"fused": False}, {"fused": False, "foreach": True}),
        ({"foreach": True}, {"foreach": True}),
        ({"foreach": False}, {"foreach": False}),  # the for-loop implementation, as asked
        ({"fused": True}, {"fused": True}),
    ):
        assert impl(adamw.model_copy(update={"extra": chosen}), "cuda") == on_cuda, chosen
    merit = OptimizerConfig(name="merit", lr=1e-3)
    assert impl(merit, "cuda") == {}
    # the model's device decides: a CPU model builds foreach
    built = build_optimizer(adamw, torch.nn.Linear(2, 2), tokens_per_step=1)
    assert built.defaults["foreach"] is True and not built.defaults["fused"]


def test_precision_and_compile_are_validated() -> None:
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, got 'fp16'"):
        cfg(precision="fp16")
    with pytest.raises(ValueError, match="compile must be true or false, got 'yes'"):
        cfg(compile="yes")


@pytest.mark.gpu
@cuda_only
@pytest.mark.parametrize("compile_model", [False, True])
def test_the_loop_trains_on_cuda_in_bf16_at_one_read_per_step(compile_model: bool) -> None:
    c = cfg(
        optimizer=OptimizerConfig(name="adamw", lr=1e-2),
        resources={"gpus_per_worker": 1, "max_micro_batch": 8},
        precision="bf16",
        compile=compile_model,
    )
    session = LocalSession()
    final = train(c, session)
    assert final["status"] == "completed"
    assert session.reports[-1]["val_loss"] < session.reports[0]["val_loss"]
    assert torch.backends.cuda.matmul.allow_tf32  # TF32 matmuls on from the first step
    assert final["tokens_per_s"] > 0
