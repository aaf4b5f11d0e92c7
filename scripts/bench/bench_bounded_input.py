"""Hostile model configs against the planner (issue 29): how long a refusal takes, and that
planning time does not grow with num_hidden_layers. Usage:

    python scripts/bench/bench_bounded_input.py [--repeat 5]

Prints, for the bundled Qwen3-30B-A3B config: the in-process time of model_shapes() and of
a whole make_plan() at 48 layers (the real model) and at 1024 (the bound), the time to
refuse 10^11 layers in process, and the wall time of `python -m warmd plan` refusing it
(process start and imports included)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from warmd.errors import WarmdInputError
from warmd.examples import resolve_model_path
from warmd.models import model_shapes
from warmd.plan import PlanRequest, make_plan


def _model(root: Path, name: str, **fields) -> Path:
    config = json.loads((Path(resolve_model_path("qwen3-30b-a3b-fp8")) / "config.json")
                        .read_text())
    (root / name).mkdir()
    (root / name / "config.json").write_text(json.dumps({**config, **fields}))
    return root / name


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def _refused(path: Path) -> None:
    try:
        model_shapes(path)
    except WarmdInputError:
        return
    raise AssertionError("not refused")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        real = _model(root, "l48", num_hidden_layers=48, decoder_sparse_step=2)
        bound = _model(root, "l1024", num_hidden_layers=1024, decoder_sparse_step=2)
        huge = _model(root, "l1e11", num_hidden_layers=10**11, decoder_sparse_step=2)

        def plan(path: Path):
            return lambda: make_plan(PlanRequest(model=str(path), target="h200",
                                                 engine="vllm"))

        make_plan(PlanRequest(model=str(real), target="h200", engine="vllm"))  # warm caches
        rows = [("model_shapes, 48 layers", _best(lambda: model_shapes(real), repeat)),
                ("model_shapes, 1024 layers", _best(lambda: model_shapes(bound), repeat)),
                ("make_plan, 48 layers", _best(plan(real), repeat)),
                ("make_plan, 1024 layers", _best(plan(bound), repeat)),
                ("refuse 10^11 layers (in process)", _best(lambda: _refused(huge), repeat))]
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "warmd", "plan", "-m", str(huge), "-t",
                               "h200", "--engine", "vllm"], capture_output=True, text=True)
        wall = time.perf_counter() - began
        assert done.returncode == 2, done.stderr
        rows.append(("`warmd plan` refusing 10^11 layers (wall, exit 2)", wall))
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "warmd", "plan", "--help"], capture_output=True)
        rows.append(("`warmd plan --help` (wall: start-up alone)", time.perf_counter() - began))
    for what, seconds in rows:
        print(f"{what:52} {seconds * 1000:10.2f} ms")


if __name__ == "__main__":
    main()
