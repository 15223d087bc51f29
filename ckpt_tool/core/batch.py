"""Effective-batch arithmetic: global batch = micro-batch x grad accumulation x data-parallel size. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_tool.errors import CkptError, ExitCode


@dataclass(frozen=True)
class BatchConfig:
    """How a global batch is split: ``micro_batch`` samples per rank per forward, ``grad_accum`` forwards
    per optimizer step, over ``dp_size`` data-parallel ranks. Raises ``ValueError`` unless each is a
    positive integer."""

    micro_batch: int
    grad_accum: int
    dp_size: int

    def __post_init__(self) -> None:
        for name in ("micro_batch", "grad_accum", "dp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: ``micro_batch x grad_accum x dp_size``."""
        return self.micro_batch * self.grad_accum * self.dp_size


@dataclass(frozen=True)
class BatchRequest:
    """What a training command asked for (None: not given). Resolved at the world size it runs at:
    on a fresh start by ``resolve_batch``; on a resume by ``core.reshard_plan.plan_resume``, where the
    checkpoint's global batch wins unless ``global_batch`` is given explicitly (a deliberate change)
    and ``micro_batch`` is kept when it divides the per-rank share."""

    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None

    @classmethod
    def of(cls, batch: BatchConfig | BatchRequest | None) -> BatchRequest | None:
        """A split given as a ``BatchConfig`` asks for its micro-batch and accumulation; its
        global batch follows from the world size, so it is not an explicit demand."""
        if isinstance(batch, BatchConfig):
            return cls(batch.micro_batch, batch.grad_accum, None)
        return batch

    def resolve(self, dp_size: int) -> BatchConfig:
        """The split on ``dp_size`` data-parallel ranks (``resolve_batch``); raises its ``CkptError`` when
        no split fits what was asked."""
        return resolve_batch(dp_size, self.micro_batch, self.grad_accum, self.global_batch)


def resolve_batch(dp_size: int, micro_batch: int | None, grad_accum: int | None, global_batch: int | None) -> BatchConfig:
    """Fill in the missing values of (micro-batch, grad accumulation, global batch) for ``dp_size``.

    Given all three, they must agree; given the global batch and one other, the third is derived
    when it divides exactly; the global batch alone means grad accumulation 1. Without a global
    batch: micro-batch 8 and grad accumulation 1 unless given.
    """
    if global_batch is None:
        return BatchConfig(micro_batch or 8, grad_accum or 1, dp_size)
    hint = "choose a global batch divisible by micro-batch x ranks (x grad accumulation), or give only two of --micro-batch, --grad-accum, --global-batch"
    if micro_batch is not None and grad_accum is not None:
        product = micro_batch * grad_accum * dp_size
        if product != global_batch:
            raise CkptError(
                f"micro-batch {micro_batch} x grad accumulation {grad_accum} x {dp_size} ranks = {product}, not the global batch {global_batch}",
                hint,
                ExitCode.USAGE,
            )
        return BatchConfig(micro_batch, grad_accum, dp_size)
    if micro_batch is None:
        grad_accum = grad_accum or 1
        micro_batch, rest = divmod(global_batch, grad_accum * dp_size)
        what = f"grad accumulation {grad_accum} x {dp_size} ranks"
    else:
        grad_accum, rest = divmod(global_batch, micro_batch * dp_size)
        what = f"micro-batch {micro_batch} x {dp_size} ranks"
    if rest or micro_batch < 1 or grad_accum < 1:
        raise CkptError(f"global batch {global_batch} is not divisible by {what}", hint, ExitCode.USAGE)
    return BatchConfig(micro_batch, grad_accum, dp_size)
