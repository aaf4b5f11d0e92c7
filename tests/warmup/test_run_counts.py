"""A run's counters count each kernel once, whichever of the tasks that share it named it:
DeepGEMM names a kernel once per process, so a helper kernel two tasks use shows under one
or both depending on which process ran which task, and the counts must not follow that."""

from __future__ import annotations

from warmd.executors.base import KernelOutcome, TaskResult
from warmd.stats import Outcome
from warmd.tasks import Task
from warmd.warmup.report import Mode, TaskReport, WarmupReport, count, run_kernels

LIB = "deep_gemm"
C, R, L = Outcome.COMPILED, Outcome.REMOTE_HIT, Outcome.LOCAL_HIT


def _report(key: str, *kernels: tuple[str, Outcome], mode: Mode = Mode.LIBRARY,
            library: str = LIB) -> TaskReport:
    task = Task(key=key, library=library, kernel="gemm")
    outcomes = [KernelOutcome(name, outcome, 2.0 if outcome == C else 0.0)
                for name, outcome in kernels]
    return TaskReport(task, TaskResult(key, library, True, 1.0, outcomes), mode=mode)


def _totals(reports: list[TaskReport]) -> tuple:
    c = count(reports)
    hits = WarmupReport("plan", len(reports), reports, c, 1.0).hits_by_mode()
    return c.kernels, c.compiled, c.remote_hits, c.local_hits, c.compile_seconds, hits


def test_a_shared_kernel_named_by_one_task_or_both_counts_the_same():
    named_once = [_report("a", ("gemm1", C), ("transpose", C)), _report("b", ("gemm2", C))]
    named_twice = [_report("a", ("gemm1", C), ("transpose", C)),
                   _report("b", ("gemm2", C), ("transpose", L))]
    named_by_b = [_report("a", ("gemm1", C), ("transpose", L)),
                  _report("b", ("gemm2", C), ("transpose", C))]
    expected = (3, 3, 0, 0, 6.0, {Mode.VERIFIED: 0, Mode.LIBRARY: 0})
    assert _totals(named_once) == _totals(named_twice) == _totals(named_by_b) == expected


def test_a_kernel_installed_from_the_store_counts_as_one_remote_hit():
    reports = [_report("a", ("transpose", L)), _report("b", ("transpose", R))]
    assert _totals(reports)[:4] == (1, 0, 1, 0)
    assert [(r.task.key, k.outcome) for r, k in run_kernels(reports)] == [("b", R)]


def test_a_warm_run_counts_each_kernel_one_local_hit():
    reports = [_report("a", ("gemm1", L), ("transpose", L), mode=Mode.VERIFIED),
               _report("b", ("gemm2", L), ("transpose", L), mode=Mode.VERIFIED)]
    assert _totals(reports) == (3, 0, 0, 3, 0.0, {Mode.VERIFIED: 3, Mode.LIBRARY: 0})


def test_kernels_of_two_libraries_with_one_name_are_two_kernels_and_failures_all_count():
    failed = _report("c", ("gemm", Outcome.FAILED))
    failed.result.ok = False
    reports = [_report("a", ("k", C)), _report("b", ("k", C), library="triton"),
               failed, _report("d", ("gemm", Outcome.FAILED))]
    c = count(reports)
    assert (c.compiled, c.failed, c.tasks_failed) == (2, 2, 1)
