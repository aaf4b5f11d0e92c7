"""What `warmd warmup` shows: the plan line before the run, the live progress (WarmupDisplay:
an overall bar and a line per task on a terminal, a line per event elsewhere), and the
closing summary every warmup ends in (summary_text)."""

from __future__ import annotations

import threading
from dataclasses import replace

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from warmd.cli.render import make_console, prose_width, shorten, wrapped
from warmd.stats import Counters, Outcome, format_seconds
from warmd.tasks import Task
from warmd.warmup import Build, TaskReport, WarmupReport


def plan_line(plan_key: str, tasks: list[Task], seconds: float, known: int) -> str:
    """What the run is about to do, before it does it: the plan's tasks per library, and
    how long compiling them took the cluster before (when it has done so)."""
    libraries: dict[str, int] = {}
    for task in tasks:
        libraries[task.library] = libraries.get(task.library, 0) + 1
    what = ", ".join(f"{lib} {n}" for lib, n in sorted(libraries.items()))
    line = f"warmup: plan {plan_key}: {len(tasks)} task(s) ({what})"
    if known:
        some = "" if known == len(tasks) else f" for {known} of them"
        line += (f"; compiling them took {format_seconds(seconds)}{some} before (the "
                 "shared cache's history); what it holds is fetched instead")
    return line


def describe_task(task: Task) -> str:
    """What a worker builds for a task, as a person reads it: the FlashInfer module, or the
    kernel with its GEMM shape and how many M values it compiles."""
    if task.module:
        return f"{task.library} {task.module}"
    groups = f"{task.num_groups}x" if task.num_groups else ""
    m = f", {len(task.m)} M values" if task.m else ""
    return f"{task.library} {task.kernel} {groups}N={task.n} K={task.k}{m}"


class WarmupDisplay:
    """A warmup's progress on stderr. On a terminal: the overall bar, and under it one live
    line per task being warmed (what, for how long: it may be fetched from the shared cache
    or built). Elsewhere (a log, a pipe): one line when a task starts and one when it ends.
    A failure is always a line of its own, printed above the live lines, never glued onto
    the bar. Once the run is stopping (Ctrl-C, SIGTERM), a task that ends unfinished is
    interrupted, not failed: the summary counts it nowhere."""

    def __init__(self, total: int, console: Console | None = None) -> None:
        self.console = console or make_console(stderr=True)
        self.total = total
        self.counts = {"compiled": 0, "failed": 0}  # kernels compiled, tasks failed
        self.lock = threading.Lock()
        self._stopping = False
        self.interrupted: set[str] = set()  # keys of the tasks the stop ended unfinished
        self.in_flight: dict[str, Task] = {}  # started, not finished
        self.overall = Progress(
            TextColumn("[bold]warmup[/]"), BarColumn(), MofNCompleteColumn(),
            TextColumn("tasks  {task.fields[compiled]} compiled  {task.fields[failed]} failed"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console)
        self.bar = self.overall.add_task("warmup", total=total, **self.counts)
        self.current = Progress(TextColumn("  "), SpinnerColumn(), TextColumn("warming"),
                                TextColumn("{task.description}"), TimeElapsedColumn(),
                                console=self.console)
        self.running: dict[str, TaskID] = {}
        self.live = (Live(Group(self.overall, self.current), console=self.console,
                          refresh_per_second=4) if self.console.is_terminal else None)

    def __enter__(self) -> WarmupDisplay:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
        if self._stopping:  # a task the stop ended before its result came back
            with self.lock:
                for task in self.in_flight.values():
                    self._say_interrupted(task)

    def _say_interrupted(self, task: Task) -> None:
        """Once per task, with the lock held: a worker thread that has taken the task out
        of in_flight has said it too, so that a run ending meanwhile (its worker threads
        are daemons) never loses the line."""
        if task.key not in self.interrupted:
            self.interrupted.add(task.key)
            self._print(Text(f"warmup: interrupted: {describe_task(task)}"))

    def stopping(self) -> None:
        """The run is being stopped: what ends unfinished from now on was interrupted."""
        self._stopping = True

    def _label(self, task: Task) -> str:
        return shorten(describe_task(task), max(20, self.console.width - 30))

    def started(self, task: Task) -> None:
        with self.lock:
            self.in_flight[task.key] = task
        if self.live is None:
            self._line(Text(f"warmup: warming {describe_task(task)}"))
            return
        with self.lock:
            self.running[task.key] = self.current.add_task(self._label(task))

    def building(self, build: Build, begun: bool) -> None:
        """A unit of cluster work (a kernel, or a module's task) begins or ends building
        here: its live line comes and goes (a module's task line also goes when the task
        finishes)."""
        if build.task is not None and begun:
            self.started(build.task)
            return
        if begun:
            label = f"{build.library} {build.name}"
            if self.live is None:
                self._line(Text(f"warmup: building {label}"))
                return
            with self.lock:
                self.running[build.name] = self.current.add_task(
                    shorten(label, max(20, self.console.width - 30)))
            return
        with self.lock:
            task_id = self.running.pop(build.name, None)
            if task_id is not None:
                self.current.remove_task(task_id)

    def finished(self, report: TaskReport, done: int, total: int) -> None:
        result = report.result
        interrupted = self._stopping and not result.ok
        with self.lock:
            self.in_flight.pop(report.task.key, None)
            if interrupted:
                self._say_interrupted(report.task)
            self.counts["compiled"] += sum(k.outcome == Outcome.COMPILED
                                           for k in result.kernels)
            self.counts["failed"] += 0 if result.ok or interrupted else 1
            task_id = self.running.pop(report.task.key, None)
            if task_id is not None:
                self.current.remove_task(task_id)
            if not interrupted:
                self.overall.update(self.bar, completed=done, **self.counts)
        if interrupted:
            return
        if self.live is not None:
            if not result.ok:
                self._line(Text.assemble(("failed", "red"),
                                         f" {report.task.key}: {result.error}"))
        else:
            outcome = "ok" if result.ok else f"FAILED: {report.task.key}: {result.error}"
            self._line(Text(f"warmup: {done}/{total} tasks ({self.counts['compiled']} "
                            f"compiled, {self.counts['failed']} failed): "
                            f"{describe_task(report.task)} in {result.seconds:.1f} s: "
                            f"{outcome}"))

    def _line(self, text: Text) -> None:
        """A line of its own: above the live lines on a terminal, else just a line."""
        with self.lock:
            self._print(text)

    def _print(self, text: Text) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)


def without_interrupted(report: WarmupReport, keys: set[str]) -> WarmupReport:
    """The report without the tasks that the stop ended unfinished: they neither failed nor
    finished, so the summary, its counters and --json count them nowhere (the progress
    said `interrupted` for each)."""
    from warmd.warmup.report import count

    kept = [r for r in report.reports if r.task.key not in keys]
    if len(kept) == len(report.reports):
        return report
    # the run's own count replaced by the kept tasks' (a kernel counts once per run, so the
    # gone tasks' own count is not what they added); the store's counters stay
    counters = Counters.from_json(report.counters.to_json())
    counters.add({name: -value for name, value in count(report.reports).to_json().items()})
    counters.add(count(kept).to_json())
    return replace(report, reports=kept, counters=counters)


def render_summary(report: WarmupReport) -> str:
    notes = []
    if report.store is not None and not report.store.ok:
        notes.append(report.store.reason)
    notes += [f"FAILED {failed.task.key}: {failed.result.error}" for failed in report.failed]
    return summary_text(f"warmup of plan {report.plan_key}: {len(report.reports)}/"
                        f"{report.selected} tasks in {report.seconds:.1f} s"
                        + (" (interrupted)" if report.interrupted else ""),
                        report.counters, notes)


def summary_text(title: str, counters: Counters, notes: list[str]) -> str:
    """Every warmup's closing summary (of a plan, or of a config's models): the counters
    under a title, then what went wrong, each note whole, wrapped at the terminal's width
    (its indentation kept, its next lines two further in)."""
    width = prose_width()
    lines = [line for note in notes for line in _wrapped_note(note, width)]
    return "\n".join([counters.render_text(title), *lines])


def _wrapped_note(note: str, width: int) -> list[str]:
    body = note.lstrip(" ")
    return wrapped(body, width, note[:len(note) - len(body)])
