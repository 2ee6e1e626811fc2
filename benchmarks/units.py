"""The fused paged loop's units and how its runs end: `python benchmarks/units.py`.

A unit of `orcasim.paged_fast.PagedFusedStepper` is a plan's iteration with its decode run
(`plan_run`), a plan's iteration alone (`plan_single`), a run continued after a run that was
not cut, without a `schedule` call (`continued`), or a unit handed to the generic stepper
(`delegated`). A run ends at its first completion, before a step whose KV blocks would not
fit (`blocks`), or where an arrival that could join or a warm-up break cuts it (`cut`). What
follows a completion is a continued run if nobody arrived and nobody waiting could join
(`after_completion: continued`), else a plan. The per-unit cost that the loop pays is what a
run spanning completions would save on the continued units, and no more: each of them still
takes its own block growth, pricing, allocations, completions and recorder row. This runs
benchmarks/instructions.py's workload (its fixed rates), in fast mode, once, uninstrumented
otherwise. `--profile` runs it again, without the counting, under cProfile and splits the
continued runs' time into what a unit boundary costs and what each part of a spanning run
would still do (the README's speed section, 2026-12-06):

    python benchmarks/units.py [--kinds paged prefill_first chunked] [--requests 20000] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import instructions  # noqa: E402 - benchmarks/instructions.py, beside this file

from orcasim import paged_fast  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402
from orcasim.scenario import scenario_from_dict  # noqa: E402

KINDS = ("paged", "prefill_first", "chunked")


class Counting(paged_fast.PagedFusedStepper):
    """The fused stepper, counting its units and their ends (the same steps otherwise)."""

    counts: collections.Counter[str] = collections.Counter()
    # What the unit pending now is, and how the last unit ended if at its natural end.
    _kind_now = ""
    _after_completion: str | None = None
    _limit: tuple[int, int] | None = None  # (steps to the first completion, steps it may take)

    def start(self, now_s: float) -> float | None:
        after_full_run = self.continuing
        self._limit = None
        end_s = super().start(now_s)
        if end_s is None:
            return None
        kind = self._kind()
        self._kind_now = kind
        self.counts["unit: " + kind] += 1
        if after_full_run and self._after_completion is not None:
            self.counts[f"after {self._after_completion}: {kind}"] += 1
        return end_s

    def _kind(self) -> str:
        if self._delegated:
            return "delegated"
        unit = self._unit
        assert unit is not None
        if unit.joiners is None:
            return "continued"
        return "plan_single" if unit.growth is None else "plan_run"

    def _decode_run(self, unit: Any, known: list[int]) -> None:
        super()._decode_run(unit, known)
        self._limit = (min(self.finish_at) - self.iterations - 1, unit.full - 1)

    def _continued(self, start_s: float) -> Any:
        unit = super()._continued(start_s)
        if unit is not None:
            self._limit = (min(self.finish_at) - self.iterations, unit.full)
        return unit

    def finish(self) -> None:
        unit, limit = self._unit, self._limit
        self._after_completion = None
        if not self._delegated and unit is not None and limit is not None:
            if len(unit.ends_s) < unit.full:
                end = "cut"
            else:
                to_completion, steps = limit
                end = "completion" if to_completion <= steps else "blocks"
                self._after_completion = f"{self._kind_now} ended at {end}"
            self.counts[f"{self._kind_now} ended at: {end}"] += 1
        super().finish()


def count_units(kind: str, num_requests: int) -> collections.Counter[str]:
    Counting.counts = collections.Counter()
    Counting._after_completion = None
    original = paged_fast.PagedFusedStepper
    paged_fast.PagedFusedStepper = Counting  # type: ignore[misc]  # the engine builds it by this name
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a saturation warning is not what is counted
            run_scenario(scenario_from_dict(instructions.scenario_dict(kind, num_requests)))
    finally:
        paged_fast.PagedFusedStepper = original  # type: ignore[misc]
    return Counting.counts


# The replica loop's functions a unit passes through (`orcasim.replica`, the source, the
# stepper's dispatch), each (module, name).
LOOP = (("replica", "_drive_one"), ("replica", "take"), ("replica", "_touch"),
        ("replica", "step"), ("replica", "next_event"), ("replica", "_end"),
        ("replica", "_plan"), ("paged_fast", "finish"), ("paged_fast", "start"),
        ("sources", "pending"), ("sources", "next_time_s"))
# What the continued path calls once a unit (a spanning run would call once for all its parts).
ONCE = (("replica", "cut_bound_s"), ("replica", "late_waiting"), ("paged", "num_queued"))
CONTINUED = ("_continued", "_finish_continued")


def profile_split(kind: str, num_requests: int) -> dict[str, float]:
    """Shares of the profiled time (cProfile's own time of every function summed)."""
    scenario = scenario_from_dict(instructions.scenario_dict(kind, num_requests))
    profiler = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profiler.runcall(run_scenario, scenario)
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # pstats' table

    def one(module: str, name: str) -> tuple[Any, Any]:
        found = [(k, v) for k, v in stats.items() if k[2] == name and k[0].endswith(f"/{module}.py")]
        assert len(found) == 1, (module, name, found)
        return found[0]

    total_s = sum(v[2] for v in stats.values())
    continued = [one("paged_fast", name)[1] for name in CONTINUED]
    path_s = sum(v[3] for v in continued)  # cumulative
    own_s = sum(v[2] for v in continued)
    once_s = sum(caller[3] for module, name in ONCE
                 for key, caller in one(module, name)[1][4].items() if key[2] in CONTINUED)
    units = sum(one("paged_fast", name)[1][1] for name in ("_plan", "_continued"))
    share = continued[0][1] / units  # the continued runs' part of the loop's units (approx.)
    loop_s = share * sum(one(module, name)[1][2] for module, name in LOOP)
    return {"continued path": path_s / total_s, "its share of the loop": loop_s / total_s,
            "its parts' own work": (path_s - own_s - once_s) / total_s,
            "saved, estimated": (loop_s + own_s / 2 + once_s) / total_s,
            "saved, at most": (loop_s + own_s + once_s) / total_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--profile", action="store_true",
                        help="also split the continued runs' profiled time (a second run)")
    args = parser.parse_args()
    for kind in args.kinds:
        counts = count_units(kind, args.requests)
        units = sum(v for k, v in counts.items() if k.startswith("unit: "))
        if not units:
            sys.exit(f"{kind}: no unit of the fused loop ran (is it still the loop for {kind}?)")
        print(f"{kind}: {units} units, {units / args.requests:.3f} a request")
        for key, value in sorted(counts.items()):
            print(f"  {key:<48} {value:>8}  {value / args.requests:6.3f} a request  "
                  f"{100 * value / units:5.1f}% of units")
        if args.profile:
            for key, fraction in profile_split(kind, args.requests).items():
                print(f"  profile: {key:<40} {100 * fraction:5.1f}%")


if __name__ == "__main__":
    main()
