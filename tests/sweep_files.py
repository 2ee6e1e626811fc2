"""Test files: a tiny scenario, sweep files and a scenario with a relative trace path,
written into a temporary folder."""

from __future__ import annotations

from pathlib import Path

TINY_SCENARIO = """\
name: tiny
seed: 3
workload:
  num_requests: 60
  arrival: {kind: poisson, rate_per_s: 4.0}
  prompt_tokens: {kind: uniform, low: 16, high: 256}
  output_tokens: {kind: uniform, low: 1, high: 32}
  max_tokens: 320
cost: {kind: linear, base_s: 0.010, per_token_s: 2.0e-5, per_context_token_s: 1.0e-7}
kv_capacity_tokens: 20000
systems:
  - {name: request-level, scheduler: {kind: request_level, max_batch_size: 4}}
  - {name: orca, scheduler: {kind: iteration_level, max_batch_size: 4}}
"""


def write_sweep(folder: Path, grid: str, replications: int = 1, name: str = "tiny_sweep") -> Path:
    """A sweep file over the tiny scenario; `grid` is the YAML body of `grid:`."""
    (folder / "tiny.yaml").write_text(TINY_SCENARIO)
    path = folder / f"{name}.yaml"
    body = "\n".join("  " + line for line in grid.strip().splitlines())
    path.write_text(f"name: {name}\nbase: tiny.yaml\nreplications: {replications}\nseed: 5\n"
                    f"grid:\n{body}\n")
    return path


def write_grid_4x3(tmp_path: Path) -> Path:
    """The issue's 4 x 3 sweep: four loads against three Orca batch sizes."""
    return write_sweep(tmp_path, """
mode: product
parameters:
  workload.arrival.rate_per_s: [1.0, 2.0, 4.0, 8.0]
  systems[1].scheduler.max_batch_size: [2, 4, 8]
""")


def write_trace_scenario(folder: Path) -> Path:
    """s.yaml replaying trace.csv beside it, named by a relative path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,12,3\n")
    (folder / "s.yaml").write_text(
        "name: rel\nworkload: {arrival: {kind: trace, path: trace.csv}, max_tokens: 100}\n"
        "cost: {kind: linear, base_s: 0.01, per_token_s: 0.0}\nkv_capacity_tokens: 1000\n"
        "systems: [{name: a, scheduler: {kind: iteration_level, max_batch_size: 2}}]\n")
    return folder / "s.yaml"


def die_at_two(job: int) -> tuple[str, int]:
    """A job runner whose job 2 kills its worker, as the OOM killer would (for a pool's
    workers to import: a module-level function)."""
    import os
    import time

    if job == 2:
        time.sleep(0.2)  # the others in flight meanwhile
        os._exit(9)
    time.sleep(0.3)
    return ("ok", job)
