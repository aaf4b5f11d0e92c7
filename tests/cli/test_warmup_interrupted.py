"""What `warmd warmup`'s display and summary say of tasks a stop (Ctrl-C, SIGTERM) ended:
each said interrupted exactly once, whether its worker thread or the run's end gets there
first, and counted nowhere (the run's other counts left as they are)."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from warmd.cli.warmup_view import WarmupDisplay, without_interrupted
from warmd.executors.base import KernelOutcome, TaskResult
from warmd.stats import Outcome
from warmd.tasks import Task
from warmd.warmup import TaskReport, WarmupReport
from warmd.warmup.report import count


def _task(name: str) -> Task:
    return Task(key=f"flashinfer/act_and_mul/{name}/0123456789ab", library="flashinfer",
                kernel="act_and_mul", module=name)


def _stopped(task: Task) -> TaskReport:
    return TaskReport(task, TaskResult(task.key, "flashinfer", False, 1.0,
                                       [KernelOutcome(task.module, "failed", 1.0)],
                                       "interrupted"))


def _said(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if "interrupted:" in line]


def _display() -> tuple[WarmupDisplay, io.StringIO]:
    out = io.StringIO()
    return WarmupDisplay(2, Console(file=out, force_terminal=False, width=100)), out


def test_a_task_the_stop_ended_is_said_once_whoever_sees_it_first():
    task = _task("silu_and_mul")
    for worker_first in (True, False):
        display, out = _display()
        display.__enter__()
        display.started(task)
        display.stopping()
        if worker_first:
            display.finished(_stopped(task), 1, 1)
            display.__exit__(None, None, None)
        else:
            display.__exit__(None, None, None)
            display.finished(_stopped(task), 1, 1)
        assert _said(out) == ["warmup: interrupted: flashinfer silu_and_mul"], worker_first
        assert display.interrupted == {task.key}


def test_the_line_is_never_lost_to_the_run_ending_while_a_worker_reports():
    """A worker thread has taken its interrupted task out of the in-flight set and is
    printing its line when the run ends (its worker threads are daemons, gone at exit):
    by the time the display's end returns, the line has been printed."""
    display, out = _display()
    task = _task("silu_and_mul")
    display.__enter__()
    display.started(task)
    display.stopping()
    printing, release = threading.Event(), threading.Event()
    print_line = display.console.print

    def slow_print(text, **kw):
        if threading.current_thread() is not threading.main_thread() and \
                not printing.is_set():
            printing.set()
            release.wait(5)
        print_line(text, **kw)

    display.console.print = slow_print
    worker = threading.Thread(target=display.finished, args=(_stopped(task), 1, 1))
    worker.start()
    assert printing.wait(5)
    said_at_end: list[list[str]] = []

    def end_run() -> None:
        display.__exit__(None, None, None)
        said_at_end.append(_said(out))

    ending = threading.Thread(target=end_run)
    ending.start()
    ending.join(0.5)  # the run's end, while the worker is still in its print
    release.set()
    ending.join(5)
    worker.join(5)
    assert said_at_end == [["warmup: interrupted: flashinfer silu_and_mul"]]


def test_leaving_out_interrupted_tasks_keeps_the_kernels_the_others_counted():
    kept, gone = _task("gelu_and_mul"), _task("silu_and_mul")
    compiled = TaskReport(kept, TaskResult(kept.key, "flashinfer", True, 2.0,
                                           [KernelOutcome("shared", Outcome.COMPILED, 2.0)]))
    # the stopped task had touched the module the other compiled, then was stopped
    stopped = TaskReport(gone, TaskResult(gone.key, "flashinfer", False, 1.0,
                                          [KernelOutcome("shared", Outcome.LOCAL_HIT),
                                           KernelOutcome("silu_and_mul", "failed", 1.0)],
                                          "interrupted"))
    reports = [compiled, stopped]
    report = WarmupReport("plan", 2, reports, count(reports), 3.0)
    left = without_interrupted(report, {gone.key})
    c = left.counters
    assert (c.tasks, c.tasks_failed, c.compiled, c.local_hits, c.failed) == (1, 0, 1, 0, 0)
    assert [r.task.key for r in left.reports] == [kept.key]
