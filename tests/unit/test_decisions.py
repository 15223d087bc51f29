"""The pure decisions behind verify and rollback: which checks pass, where a rollback lands and
what it moves aside."""

from __future__ import annotations

import math

import pytest

from ckpt_tool.core.manifest import Probe
from ckpt_tool.core.probe_checks import TOLERANCE, probe_checks
from ckpt_tool.core.recovery import fallback_step, steps_to_quarantine_on_rollback

RECORDED = Probe(loss=2.5, grad_norm=0.75, lr=3e-4, step=20)


def checks(measured: Probe, lr: float | None = 3e-4, state_step: int | None = 20, exact: bool = True, manifest_step: int = 20):
    return {c.name: c for c in probe_checks(RECORDED, manifest_step, state_step, lr, measured, exact)}


def test_bit_exact_comparison_passes_only_on_equal_bits():
    assert all(c.ok and c.how == "exact" for c in checks(RECORDED).values())
    nudged = Probe(math.nextafter(2.5, 3.0), 0.75, 3e-4, 20)
    failed = checks(nudged)
    assert not failed["loss"].ok and failed["grad_norm"].ok
    assert failed["loss"].describe() == f"loss: recorded 2.5, measured {math.nextafter(2.5, 3.0)!r} (exact)"


def test_tolerance_comparison_accepts_reduction_noise_and_refuses_damage():
    noise = Probe(2.5 * (1 + TOLERANCE["loss"] / 10), 0.75 * (1 - TOLERANCE["grad_norm"] / 10), 3e-4, 20)
    assert all(c.ok for c in checks(noise, exact=False).values())
    damage = Probe(2.5 * (1 + 10 * TOLERANCE["loss"]), 0.75, 3e-4, 20)
    result = checks(damage, exact=False)
    assert not result["loss"].ok and result["loss"].how == f"rel {TOLERANCE['loss']:g}"
    assert not checks(Probe(float("nan"), 0.75, 3e-4, 20), exact=False)["loss"].ok


@pytest.mark.parametrize(
    "state_step, manifest_step, ok",
    [(20, 20, True), (19, 20, False), (None, 20, False), (20, 21, False)],
)
def test_the_step_counter_must_agree_everywhere(state_step, manifest_step, ok):
    assert checks(RECORDED, state_step=state_step, manifest_step=manifest_step)["step"].ok is ok


def test_a_checkpoint_without_scheduler_state_skips_the_lr_check():
    lr = checks(RECORDED, lr=None)["lr"]
    assert lr.ok and lr.how.startswith("skipped")
    assert not checks(RECORDED, lr=1e-3)["lr"].ok


def test_fallback_is_the_newest_step_older_than_the_bad_one():
    assert fallback_step([10, 20, 30], 30) == 20
    assert fallback_step([30, 10, 20], 25) == 20  # order on disk does not matter
    assert fallback_step([10, 20, 30], None) == 30
    assert fallback_step([10], 10) is None and fallback_step([], None) is None


@pytest.mark.parametrize(
    "committed, latest, target, moved",
    [
        ([10, 20, 30, 40], 40, 20, [30, 40]),  # every step after the target up to LATEST
        ([10, 20, 30, 40], 30, 20, [30]),  # a step newer than LATEST is not this rollback's to judge
        ([10, 20, 30, 40], None, 20, [30, 40]),  # LATEST unknown (garbage): everything after the target
        ([10, 20], 20, 20, []),  # LATEST itself passed: nothing moves
    ],
)
def test_rollback_moves_aside_what_comes_after_the_target(committed, latest, target, moved):
    assert steps_to_quarantine_on_rollback(committed, latest, target) == moved
