"""The spare maker's fork-safety decision (supervise.spare_maker.fork_hazard): plain data."""

from __future__ import annotations

from ckpt_tool.supervise.spare_maker import fork_hazard


def test_no_new_thread_and_no_cuda_is_safe() -> None:
    assert fork_hazard("--warm-import mymod", False, 2, 2) is None
    assert fork_hazard("--warm-import mymod", False, 3, 2) is None  # a thread that ended is no hazard


def test_a_thread_pool_started_at_import_names_the_module_and_what_to_do() -> None:
    why = fork_hazard("--warm-import mymod", False, 2, 3)
    assert why is not None
    assert "--warm-import mymod started 1 thread (2 -> 3" in why and "OpenMP" in why and "deadlock" in why
    assert "leave it out of --warm-import or run no torch operation at its import" in why
    assert "started 15 threads" in (fork_hazard("--warm-import m", False, 2, 17) or "")


def test_cuda_started_is_a_hazard_even_without_a_new_thread() -> None:
    why = fork_hazard("--warm-import gpu_mod", True, 2, 2)
    assert why is not None and "--warm-import gpu_mod started CUDA" in why and "torch.cuda.is_initialized()" in why
