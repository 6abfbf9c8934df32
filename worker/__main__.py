"""`python -m worker`: train one run and print its curve (gpt2-nano on the built-in corpus by default)."""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.table import Table

from worker.config import DataConfig, ModelConfig, OptimizerConfig, ResourcesConfig, TrainConfig

app = typer.Typer(add_completion=False)
console = Console()


@app.command()
def main(
    optimizer: str = typer.Option("merit", help="adamw | lamb | lion | merit | sophia"),
    lr: float = typer.Option(3e-3, help="peak learning rate"),
    batch_size: int = typer.Option(16, help="global batch, sequences"),
    token_budget: int = typer.Option(300_000, help="tokens to train on"),
    preset: str = typer.Option("gpt2-nano"),
    seq_len: int = typer.Option(64),
    source: str = typer.Option("builtin", help="builtin | PATH | hf:DATASET[:CONFIG]"),
    workers: int = typer.Option(1, help=">1 runs DDP through Ray Train on a local Ray cluster"),
    seed: int = typer.Option(0),
) -> None:
    logging.basicConfig(level=logging.WARNING)
    cfg = TrainConfig(
        model=ModelConfig(preset=preset, seq_len=seq_len),
        data=DataConfig(source=source),
        optimizer=OptimizerConfig(name=optimizer, lr=lr),
        resources=ResourcesConfig(workers_per_trial=workers),
        batch_size=batch_size,
        token_budget=token_budget,
        seed=seed,
    )
    console.print(
        f"[bold]{preset}[/] on {source}: {optimizer} lr={lr:g}, batch {batch_size} x {seq_len} tokens, "
        f"{cfg.total_steps} steps ({token_budget:,} tokens), {workers} worker(s)"
    )
    table = Table("tokens", "step", "train loss", "val loss", "lr", "tokens/s", "max attn logit", "B_simple")

    def row(m: dict) -> None:
        table.add_row(
            f"{m['tokens']:,}",
            str(m["step"]),
            f"{m['train_loss']:.3f}",
            f"{m['val_loss']:.3f}",
            f"{m['lr']:.2e}",
            f"{m['tokens_per_s']:,.0f}",
            f"{m.get('attn_logit_max', float('nan')):.2f}",
            f"{m['noise_scale']:.1f}" if "noise_scale" in m else "-",
        )

    if workers > 1:
        from worker.launch import run_training

        result = run_training(cfg)
        for m in result.history:
            if "val_loss" in m:
                row(m)
        final = result.final
    else:
        from worker.loop import train
        from worker.session import LocalSession

        session = LocalSession(
            on_report=lambda m: console.print(
                f"  tokens {m['tokens']:>9,}  val loss {m.get('val_loss', float('nan')):.3f}"
            )
        )
        final = train(cfg, session)
        for m in session.reports:
            if "val_loss" in m:
                row(m)
    console.print(table)
    console.print(f"status: [bold]{final['status']}[/], final val loss {final.get('val_loss', float('nan')):.4f}")


if __name__ == "__main__":
    app()
