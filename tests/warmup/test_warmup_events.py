"""A run's event record (warmd.warmup.events): each kernel's outcome, each task's kernels
and the boot report are read from the events as they came, in whatever order the claim
loops' threads and the tasks appended them."""

from __future__ import annotations

import threading

from warmd.coordination import WorkKind
from warmd.executors.base import TaskResult
from warmd.stats import Outcome
from warmd.tasks import Task
from warmd.warmup.events import Event, KernelEvent, Naming, RunEvents, boot
from warmd.warmup.report import TaskReport, count

LIB = "testlib"
E = KernelEvent


def _unit(kind: KernelEvent, name: str, at: float, seconds: float = 0.0) -> Event:
    return Event(kind, LIB, name, WorkKind.ENTRY, seconds=seconds, at=at)


def _report(key: str, kernels) -> TaskReport:
    task = Task(key=key, library=LIB, kernel="k")
    return TaskReport(task, TaskResult(key, LIB, True, 0.0, list(kernels)))


def _outcomes(kernels) -> dict[str, tuple[Outcome, float]]:
    return {k.name: (k.outcome, k.seconds) for k in kernels}


def test_one_kernel_waited_for_and_installed_here_built_on_the_other_node():
    """Kernel a: held by node 2 (node 1 waits, then installs it), built there; kernel b the
    other way round. Each node's events interleave both kernels and two tasks naming
    them; each kernel gets one outcome per node, counted once, whichever task names it
    first."""
    one, two = RunEvents(), RunEvents()
    for event in [_unit(E.CLAIMED, "b", 1.0), _unit(E.WAITED, "a", 1.1),
                  _unit(E.BUILT, "b", 3.0, seconds=1.9), _unit(E.INSTALLED, "a", 4.5)]:
        one.add(event)
    for event in [_unit(E.CLAIMED, "a", 1.0), _unit(E.WAITED, "b", 1.2),
                  _unit(E.BUILT, "a", 4.0, seconds=3.0), _unit(E.INSTALLED, "b", 4.2)]:
        two.add(event)

    for node, built, installed, seconds, waited in [(one, "b", "a", 1.9, 3.4),
                                                    (two, "a", "b", 3.0, 3.0)]:
        first = node.name("t1", LIB, [Naming("a"), Naming("b")])
        second = node.name("t2", LIB, [Naming(built)])
        assert _outcomes(first) == {built: (Outcome.COMPILED, seconds),
                                    installed: (Outcome.REMOTE_HIT, 0.0)}
        assert _outcomes(second) == {built: (Outcome.LOCAL_HIT, 0.0)}
        derived = node.derived()
        assert derived.kernels == {(LIB, built): Outcome.COMPILED,
                                   (LIB, installed): Outcome.REMOTE_HIT}
        report = boot(derived.of([LIB], [WorkKind.ENTRY]), {})
        assert (report.compiled, report.installed, report.waited, report.took_over,
                report.failed) == (1, 1, 1, 0, 0)
        assert round(report.wait_seconds, 3) == waited
        counters = count([_report("t1", first), _report("t2", second)])
        # t2's local hit is the kernel t1 just compiled here: counted once, as compiled
        assert (counters.compiled, counters.remote_hits, counters.local_hits,
                counters.failed) == (1, 1, 0, 0)
        assert counters.compile_seconds == seconds


def test_a_unit_taken_over_from_a_dead_claimer_is_built_here_and_waited_for():
    events = RunEvents()
    for event in [_unit(E.WAITED, "a", 0.5), _unit(E.TOOK_OVER, "a", 2.0),
                  _unit(E.CLAIMED, "a", 2.1), _unit(E.BUILT, "a", 2.5, seconds=0.4),
                  _unit(E.CLAIMED, "c", 2.6), Event(E.FAILED, LIB, "c", WorkKind.ENTRY,
                                                    seconds=0.2, error="nvcc", at=2.9)]:
        events.add(event)
    kernels = events.name("t", LIB, [Naming("a"), Naming("c")])
    assert _outcomes(kernels) == {"a": (Outcome.COMPILED, 0.4), "c": (Outcome.FAILED, 0.2)}
    derived = events.derived()
    assert derived.unit(LIB, WorkKind.ENTRY, "c").error == "nvcc"
    report = boot(derived.of([LIB], [WorkKind.ENTRY]), {})
    assert (report.compiled, report.waited, report.took_over, report.failed) == (1, 1, 1, 1)
    assert round(report.wait_seconds, 3) == 2.0


def test_a_stage_compile_counts_once_and_a_store_install_stays_a_remote_hit():
    """With a kernel stage: a kernel the stage compiled is counted compiled (nvcc's time)
    by the first task naming it, whatever its library said; one the store installed is a
    remote hit. Without one, what the library said stands."""
    events = RunEvents()
    events.add(Event(E.INSTALLED, LIB, "theirs"))
    events.compiled(LIB, "mine", 7.5)
    events.compiled(LIB, "mine", 9.0)  # the first is the stage's answer
    events.compiled(LIB, "theirs", 1.0)
    hits = [Naming("mine", Outcome.LOCAL_HIT), Naming("theirs", Outcome.LOCAL_HIT)]
    first = events.name("t1", LIB, hits, staged=True)
    again = events.name("t2", LIB, [Naming("mine", Outcome.COMPILED, 3.0)], staged=True)
    assert _outcomes(first) == {"mine": (Outcome.COMPILED, 7.5),
                                "theirs": (Outcome.REMOTE_HIT, 0.0)}
    assert _outcomes(again) == {"mine": (Outcome.LOCAL_HIT, 0.0)}
    plain = [events.name(t, "other", [Naming("x", Outcome.COMPILED, 2.0)]) for t in "ab"]
    assert [_outcomes(k) for k in plain] == [{"x": (Outcome.COMPILED, 2.0)}] * 2


def test_threads_appending_at_once_give_the_outcomes_a_reading_of_all_gives():
    """Built, installed and named from several threads at once: what each naming got as
    it came is what reading the whole record again says, and each kernel is counted
    compiled once."""
    events = RunEvents()
    names = [f"k{i}" for i in range(40)]

    def node_work(part: list[str]) -> None:
        for name in part:
            events.add(Event(E.CLAIMED, LIB, name, WorkKind.ENTRY))
            events.add(Event(E.BUILT, LIB, name, WorkKind.ENTRY, seconds=1.0))

    got: dict[int, list] = {}

    def task(i: int) -> None:
        got[i] = events.name(f"t{i}", LIB, [Naming(n) for n in names])

    threads = [threading.Thread(target=node_work, args=(names[i::4],)) for i in range(4)]
    threads += [threading.Thread(target=task, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    task(6)  # after every build
    derived = events.derived()
    assert sorted(map(_outcomes, derived.namings.values()), key=str) == \
        sorted(map(_outcomes, got.values()), key=str)
    compiled = [k.name for kernels in got.values() for k in kernels
                if k.outcome == Outcome.COMPILED]
    assert sorted(compiled) == sorted(names)
    assert all(o == Outcome.COMPILED for o in derived.kernels.values())
