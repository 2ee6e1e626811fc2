"""The benchmark scripts' own rules (benchmarks/): what they write, and where."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


engine = _script("engine")


def test_a_partial_run_leaves_the_committed_results_alone(tmp_path: Path) -> None:
    """`--sizes 200 --schedulers paged` replaced the 15 rows behind the README's table with
    one (a tester's finding): a partial run writes only to an --out given."""
    committed = tmp_path / "engine.json"
    committed.write_text("{}\n")
    engine.write_report({"results": [1]}, None, committed, complete=False)
    assert committed.read_text() == "{}\n"
    engine.write_report({"results": [1]}, None, committed, complete=True)
    assert json.loads(committed.read_text()) == {"results": [1]}
    out = tmp_path / "mine" / "partial.json"
    engine.write_report({"results": [2]}, out, committed, complete=False)
    assert json.loads(out.read_text()) == {"results": [2]}
    assert not list(out.parent.glob(".*.tmp"))


def test_an_existing_out_needs_force(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    with pytest.raises(SystemExit):
        engine.check_out(parser, taken, force=False)
    engine.check_out(parser, taken, force=True)
    engine.check_out(parser, tmp_path / "new.json", force=False)


def test_a_complete_run_replaces_the_committed_results_only_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A complete run without --out wrote over benchmarks/results/*.json unasked (a tester's
    finding), where nothing else is overwritten without --force: refused before it runs.
    `make bench` passes --force; a partial run replaces nothing and needs none."""
    parser = argparse.ArgumentParser()
    committed = tmp_path / "engine.json"
    committed.write_text("{}")
    with pytest.raises(SystemExit):
        engine.check_out(parser, None, force=False, replaces=committed)
    assert "would replace" in capsys.readouterr().err
    engine.check_out(parser, None, force=True, replaces=committed)
    engine.check_out(parser, None, force=False, replaces=None)  # partial: nothing replaced
    engine.check_out(parser, None, force=False, replaces=tmp_path / "absent.json")
    makefile = (ROOT / "Makefile").read_text()
    for script in ("engine", "cluster", "capacity"):
        assert f"benchmarks/{script}.py --force" in makefile, script


def test_instruction_counts_run_each_kind_below_its_capacity() -> None:
    """One fixed rate (paged's) ran Orca at 117% of its capacity, saturated, its warning
    silenced (a tester's finding): each kind has its own, 85% of engine.py's measure."""
    instructions = _script("instructions")
    assert set(instructions.RATE_PER_S) == set(instructions.KINDS) - {"cluster"}
    rate = instructions.RATE_PER_S["iteration_level"]
    capacity = engine.capacity_rps("iteration_level", engine.choose_cost("roofline")[1])
    # Measured at 85% before the lengths were drawn as pairs (88cec25) and kept since, so
    # that commits compare on the same arrivals: below capacity, near 85% of it.
    assert engine.LOAD_FRACTION - 0.05 < rate / capacity < engine.LOAD_FRACTION + 0.05


@pytest.mark.parametrize("scheduler", ["iteration_level", "request_level", "paged",
                                       "prefill_first", "chunked"])
def test_benchmark_scenarios_build_without_a_warning(scheduler: str) -> None:
    """Each paged kind set `kv_bytes_per_token`, read only under swap preemption, so every
    benchmark run warned that it was unused: a benchmark's scenario is a clean one."""
    import warnings

    data = engine.scenario_dict(scheduler, 100, 0.2, "fast", engine.choose_cost("roofline")[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.simulate_once(data)


def test_a_report_says_when_it_ran_and_over_how_many_runs_each_median_is() -> None:
    """The README's tables state a date and medians of 5 and 3 runs, but engine.json and
    cluster.json held neither (a tester's finding): each row now names its repeat counts."""
    report = engine.benchmark((60,), "roofline", ("request_level",))
    assert report["date"] == time.strftime("%Y-%m-%d")
    (row,) = report["results"]
    assert (row["repeats"], row["reference_repeats"]) == (1, 1)
    cluster = _script("cluster")
    spec = {"scheduler": "iteration_level", "router": "round_robin", "num_requests": 40,
            "rate_per_s": 10.0, "cost_keys": engine.choose_cost("roofline")[1],
            "repeats": 2, "reference_repeats": 0}
    out = cluster.child(spec)
    assert "fast_cpu_s" in out and "reference_cpu_s" not in out


def test_the_unit_count_sees_every_unit_of_the_fused_loop() -> None:
    """benchmarks/units.py counts the fused paged loop's units by wrapping its stepper: if the
    engine stopped building it there, the count would read nothing. Its ends partition the
    runs, and every continued run follows a run that was not cut."""
    units = _script("units")
    counts = units.count_units("paged", 300)
    runs = counts["unit: plan_run"] + counts["unit: continued"]
    assert runs > 300
    ended = sum(v for k, v in counts.items() if " ended at: " in k)
    assert ended == runs
    after_completion = sum(v for k, v in counts.items()
                           if k.startswith("after ") and k.endswith(": continued"))
    assert after_completion == counts["unit: continued"] > 0
