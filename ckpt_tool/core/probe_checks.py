"""The four verification checks of a checkpoint, compared as plain numbers. Pure.

1. the step counter in the per-rank state equals the manifest's step;
2. the loss on the stored probe batch equals the recorded one;
3. the restored scheduler's LR equals the recorded one;
4. the gradient norm on the probe batch equals the recorded one.

Bit-exact when the world size, dtype, thread count and torch version are those of the save;
otherwise within ``TOLERANCE`` (relative): a different reduction order changes the last bits,
by about 1e-7 relative in fp32 on the reference recipe; damage changes them by far more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckpt_tool.core.manifest import Probe

TOLERANCE = {"loss": 1e-5, "lr": 1e-12, "grad_norm": 1e-4}


@dataclass(frozen=True)
class Check:
    """One verification check: the value the checkpoint recorded, the one measured after load (None when
    unknown), whether they agree, and how they were compared (``exact``, ``rel 1e-05``, ``skipped:
    ...``)."""

    name: str
    recorded: float | int | None
    measured: float | int | None
    ok: bool
    how: str  # "exact", "rel 1e-05", "skipped: ..."

    def to_json(self) -> dict[str, object]:
        """The check's fields as a JSON-ready dict (``ckpt verify --json`` and the index)."""
        return dict(self.__dict__)

    def describe(self) -> str:
        """One line for a failed check, the same in the index, at resume and in ``ckpt`` output."""
        return f"{self.name}: recorded {self.recorded!r}, measured {self.measured!r} ({self.how})"


def _compare(name: str, recorded: float, measured: float | None, exact: bool) -> Check:
    if measured is None:
        return Check(name, recorded, None, False, "missing")
    if exact:
        return Check(name, recorded, measured, recorded == measured, "exact")
    tol = TOLERANCE[name]
    ok = math.isfinite(measured) and abs(measured - recorded) <= tol * max(abs(recorded), 1e-12)
    return Check(name, recorded, measured, ok, f"rel {tol:g}")


def probe_checks(
    recorded: Probe, manifest_step: int, state_step: int | None, lr: float | None, measured: Probe, exact: bool
) -> list[Check]:
    """The four checks of the module docstring, in order: step, loss, lr (skipped, and passed, when there is
    no scheduler state) and grad_norm. ``exact``: bit-for-bit comparisons (same world size and dtype),
    else within the documented tolerance."""
    return [
        Check("step", manifest_step, state_step, state_step == manifest_step == recorded.step, "exact"),
        _compare("loss", recorded.loss, measured.loss, exact),
        _compare("lr", recorded.lr, lr, exact) if lr is not None else Check("lr", recorded.lr, None, True, "skipped: no scheduler state"),
        _compare("grad_norm", recorded.grad_norm, measured.grad_norm, exact),
    ]
