"""What a dry run says a submit would meet, beyond the spec's own validation: the GPU-hours caps and the cluster.

Domain models: `service.policy` builds them, the JSON API answers them under `caps` and `cluster`
(`service.models.DryRunResult`), the submit page and the CLI print their `summary()`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Verdict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GpuHoursCaps(_Verdict):
    """Whether a submit of this spec now would pass this service's GPU-hours caps (docs/operators.md)."""

    gpu_hours: float = Field(
        description="the price the caps judge: the most the sweep can cost (cost.gpu_hours.max) at the dry run's "
        "default pricing, one H100-SXM at MFU 0.4, whatever ?gpu=, ?mfu= or ?peak_tflops= asked"
    )
    max_gpu_hours_per_sweep: float | None = Field(description="SWEEPS_MAX_GPU_HOURS_PER_SWEEP; null: no cap")
    max_gpu_hours_per_owner: float | None = Field(
        description="SWEEPS_MAX_GPU_HOURS_PER_OWNER, per window_s; null: no cap"
    )
    window_s: float = Field(description="SWEEPS_GPU_HOURS_WINDOW_S: the period of the cap per owner (seconds)")
    owner_gpu_hours: float | None = Field(
        default=None,
        description="the prices of your sweeps submitted within the window, summed; null: no cap per owner, or "
        "not looked up",
    )
    passes: bool = Field(description="a submit now would pass every cap judged here (problems: the ones it would not)")
    problems: list[str] = Field(default_factory=list, description="what a submit now would be refused with")

    def summary(self) -> str:
        """One line for people (the CLI's dry run, the submit page's check)."""
        if not self.passes:
            return "A submit now would be refused: " + "; ".join(self.problems)
        caps = []
        if self.max_gpu_hours_per_sweep is not None:
            caps.append(f"{self.max_gpu_hours_per_sweep:g} per sweep")
        if self.max_gpu_hours_per_owner is not None:
            spent = "" if self.owner_gpu_hours is None else f", {self.owner_gpu_hours:.4g} used"
            caps.append(f"{self.max_gpu_hours_per_owner:g} per owner in {self.window_s / 86400:.3g} days{spent}")
        within = f"within the caps ({'; '.join(caps)})" if caps else "no GPU-hours cap is set"
        return f"At most {self.gpu_hours:.4g} GPU-hours: {within}."


class ClusterFit(_Verdict):
    """Whether this service's Ray cluster, with what its autoscaler can add, can run the spec's trials
    (sweeps/admission.py); a submit it cannot run is refused."""

    checked: bool = Field(description="false: the cluster's nodes could not be read, nothing was judged")
    passes: bool = Field(description="every trial fits a node the cluster has or can add (problems: why not)")
    memory_per_worker_bytes: int = Field(
        description="host memory one worker of the largest trial needs (worker/memory.py's estimate)"
    )
    gpu_memory_per_worker_bytes: int = Field(description="GPU memory one worker of the largest trial needs; 0 on CPU")
    cluster: str = Field(description="the nodes the cluster has and its autoscaler can add, for people")
    problems: list[str] = Field(default_factory=list, description="what a submit now would be refused with")

    def summary(self) -> str:
        """One line for people (the CLI's dry run, the submit page's check)."""
        if not self.checked:
            return "The cluster's nodes could not be read: whether it can run this spec was not checked."
        if not self.passes:
            return "This cluster cannot run it: " + "; ".join(self.problems)
        gpu = self.gpu_memory_per_worker_bytes
        need = f"{self.memory_per_worker_bytes / 2**30:.1f} GiB" + (f" and {gpu / 2**30:.1f} GiB of GPU" if gpu else "")
        return f"The cluster can run it (about {need} per worker)."
