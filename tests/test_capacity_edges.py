"""`orcasim capacity` at its edges: an existing --out, an SLO no rate meets, unknown prices."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import Result

from orcasim import capacity as cap
from orcasim.cli import app
from orcasim.config import ScenarioError
from orcasim.results import mark_results
from orcasim.scenario import scenario_from_dict
from orcasim.slo import slo_from_strings
from tests.conftest import make_scenario
from tests.test_capacity import ROOT, grid_file, runner, scenario_file

QUICK = ["--requests", "200", "--replications", "1", "--workers", "1", "--rel-tol", "0.1"]
IMPOSSIBLE = ["--slo", "ttft_p90=0.000001"]  # below one step of the test scenario's cost model


def readme_capacity_command() -> list[str]:
    """The first `orcasim capacity` command of the README's Capacity section, as argv."""
    section = (ROOT / "README.md").read_text().split("\n## Capacity\n", 1)[1]
    line = next(s for s in section.splitlines() if s.startswith("orcasim capacity "))
    return line.split()


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_readme_capacity_command_writes_where_a_fresh_clone_has_nothing() -> None:
    """The command refuses an existing folder, so its --out must be neither committed nor
    tracked by git later (results/capacity/ holds report.py's committed answers)."""
    if shutil.which("git") is None or git("rev-parse").returncode != 0:
        pytest.skip("needs a git checkout")
    argv = readme_capacity_command()
    assert "--out" in argv, argv
    out = argv[argv.index("--out") + 1]
    assert git("ls-files", "--", out).stdout == "", f"{out} is committed"
    assert git("check-ignore", "-q", out).returncode == 0, f"{out} is not git-ignored"


def test_readme_capacity_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As written (shortened), from a clone's root: here a temp root holding the scenario and
    the committed capacity results."""
    argv = readme_capacity_command()
    shutil.copytree(ROOT / "results" / "capacity", tmp_path / "results" / "capacity")
    (tmp_path / "scenarios").mkdir()
    shutil.copy(ROOT / argv[2], tmp_path / argv[2])
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*argv[1:], *QUICK])
    assert result.exit_code == 0, result.output
    assert (tmp_path / argv[argv.index("--out") + 1] / "capacity.csv").exists()


def capacity_folder(path: Path, listed: bool) -> Path:
    """A folder like the committed results/capacity/quickstart: results but no plan.json;
    orcasim's own (its marker lists the file) or not."""
    path.mkdir()
    (path / "capacity.csv").write_text("system,max_rate_per_s\norca,1\n")
    if listed:
        mark_results(path, ["capacity.csv"])
    return path


@pytest.mark.parametrize("listed", [True, False])
@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_an_existing_folder_without_a_plan_suggests_only_what_works(
        tmp_path: Path, listed: bool, resume: list[str]) -> None:
    """No plan.json: --resume cannot work; --force only for a folder orcasim may replace."""
    out = capacity_folder(tmp_path / "cap", listed)
    args = ["capacity", str(scenario_file(tmp_path)), "--out", str(out), *IMPOSSIBLE, *QUICK]
    result = runner.invoke(app, [*args, *resume])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "\n" not in message and "no plan.json" in message, message
    assert "pass --resume" not in message and "--out" in message
    assert ("--force" in message) == listed, message
    assert (out / "capacity.csv").read_text() == "system,max_rate_per_s\norca,1\n"
    if listed:  # what it suggests works
        assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_an_existing_folder_of_this_run_suggests_resume(tmp_path: Path) -> None:
    args = ["capacity", str(scenario_file(tmp_path)), "--out", str(tmp_path / "cap"),
            "--system", "orca", *IMPOSSIBLE, *QUICK]
    assert runner.invoke(app, args).exit_code == 0
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "pass --resume to continue it" in again.output
    assert "--force" in again.output
    other = runner.invoke(app, [*args, "--rel-tol", "0.2"])  # another plan: resume cannot help
    assert other.exit_code == 2 and "plan.json differs" in other.output
    assert "--resume" not in other.output and "resume" not in other.output  # none was asked for
    resumed = runner.invoke(app, [*args, "--rel-tol", "0.2", "--resume"])
    assert resumed.exit_code == 2 and "so this run cannot resume it" in resumed.output


def test_an_impossible_slo_is_zero_with_a_warning_and_no_target_cost(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", str(scenario_file(tmp_path)), "--out", str(out),
                                 "--system", "orca", "--target-rate", "5", *IMPOSSIBLE, *QUICK])
    assert result.exit_code == 0, result.output
    row = pd.read_csv(out / "capacity.csv").iloc[0]
    assert row["max_rate_per_s"] == 0
    lowest = pd.read_csv(out / "evaluations.csv")["rate_per_s"].min()
    warning = re.search(r"warning: orca: no rate tried met the SLO.*", result.stderr)
    assert warning is not None, result.output
    assert f"{lowest:.3g} req/s" in warning.group(0), warning.group(0)
    assert all(pd.isna(row[c]) for c in ("cost_per_hour_usd", "cost_per_million_tokens",
                                          "copies_for_target", "cost_per_hour_for_target_usd"))


def test_a_capped_answer_is_a_lower_bound_with_a_warning(tmp_path: Path) -> None:
    """From 0.001 req/s every rate passes a loose SLO: the answer is where the doublings stop
    (1.024 req/s, well below the server's limit), which read as certain before."""
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", str(scenario_file(tmp_path)), "--out", str(out),
                                 "--system", "orca", "--target-rate", "5", "--slo",
                                 "e2e_p90=1000", "--set", "workload.arrival.rate_per_s=0.001",
                                 *QUICK])
    assert result.exit_code == 0, result.output
    row = pd.read_csv(out / "capacity.csv").iloc[0]
    assert row["capped"] == 1
    assert (f"warning: orca: every rate tried met the SLOs, up to {row['max_rate_per_s']:.4g} "
            f"req/s after {cap.MAX_BRACKET_STEPS} doublings, so max_rate_per_s is a lower bound, "
            "not the capacity; copies_for_target is at most 5") in result.stderr, result.stderr


def test_a_search_where_no_point_meets_the_slo_says_why_there_is_no_front(tmp_path: Path) -> None:
    grid = grid_file(tmp_path)
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capacity", str(grid), "--out", str(out), "--system", "orca",
                                 "--price-per-gpu-hour", "2", *IMPOSSIBLE, *QUICK])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("no rate tried met the SLO") == 2, result.stderr
    assert "max_batch_size=8" in result.stderr
    assert not (out / "pareto.csv").exists() and not (out / "pareto.png").exists()
    assert "no configuration met the SLOs" in result.stderr and "pareto.csv" in result.stderr


def outcome(job: cap.SearchJob, rate: float) -> cap.SearchOutcome:
    evaluation = {"rate_per_s": rate or 0.5, "passes": float(rate > 0), "output_tokens_mean": 10.0,
                  "slo_e2e_p90": 0.8}
    return cap.SearchOutcome(job.id, job.point, job.system, job.replication, job.seed, {}, True,
                             rate, rate * 1.01 or 0.5, [evaluation])


@pytest.mark.parametrize("price", [None, 2.0])
@pytest.mark.parametrize("rate", [0.0, 3.0])
def test_a_cost_is_empty_where_it_is_undefined(price: float | None, rate: float) -> None:
    """No price: no cost. No rate met the SLOs: no cost per token and no number of copies."""
    sc = make_scenario()
    jobs = cap.search_jobs(sc, Path("."), slo_from_strings(["e2e_p90 <= 1"]), 1,
                           cap.SearchSettings(num_requests=100), systems=["orca"])
    row = cap.capacity_table([outcome(jobs[0], rate)], jobs, price, target_rate_per_s=10.0).iloc[0]
    known = price is not None
    assert math.isnan(row["cost_per_hour_usd"]) != known
    defined = known and rate > 0
    assert math.isnan(row["cost_per_million_tokens"]) != defined
    assert math.isnan(row["cost_per_hour_for_target_usd"]) != defined
    assert math.isnan(row["copies_for_target"]) == (rate == 0)
    if rate > 0:
        assert row["copies_for_target"] == 4


def test_no_front_reason_names_the_missing_price() -> None:
    slo = slo_from_strings(["e2e_p90 <= 1"])
    table = pd.DataFrame({"point": [0, 1], "system": "orca", "max_rate_per_s": [1.0, 2.0],
                          "cost_per_million_tokens": [math.nan, math.nan],
                          "slo_e2e_p90_at_capacity": [0.5, 0.6]})
    assert "--price-per-gpu-hour" in cap.no_front_reason(table, slo)
    table["cost_per_million_tokens"] = [3.0, 2.0]
    assert cap.no_front_reason(table, slo) is None
    assert cap.no_front_reason(table.iloc[:1], slo) is None  # one point: no front to draw


def test_replications_that_found_no_rate_are_named() -> None:
    """One of a's two replications passed no rate: its mean averages a zero in."""
    table = pd.DataFrame({"point": [0, 0], "system": ["a", "b"], "max_rate_per_s": [1.0, 2.0]})
    tried = pd.DataFrame({"point": [0] * 6, "system": ["a"] * 4 + ["b"] * 2,
                          "replication": [0, 0, 1, 1, 0, 1],
                          "rate_per_s": [1.0, 2.0, 1.0, 0.5, 1.0, 1.0],
                          "passes": [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]})
    result = cap.CapacityResult(table, tried, [], 4, 0)
    assert cap.capacity_warnings(result, slo_from_strings(["e2e_p90=1"])) == [
        "a: 1 of 2 replications found no rate within the SLOs; max_rate_per_s 1 averages them in"]


# --- a tester's cases: M/D/1, one request at a time, each exactly 0.1 s (10 req/s at most) ---

# MD1's highest Poisson rate within e2e_p90 <= 1: the M/D/1 waiting time (Erlang's formula,
# service 0.1 s) is within 0.9 s for 90% of requests at 8.817 req/s.
MD1_E2E_P90_1_RPS = 8.817
MD1 = {"name": "md1", "seed": 7,
       "workload": {"num_requests": 60, "arrival": {"kind": "poisson", "rate_per_s": 5.0},
                    "prompt_tokens": {"kind": "constant", "value": 1},
                    "output_tokens": {"kind": "constant", "value": 1}, "max_tokens": 2},
       "cost": {"kind": "linear", "base_s": 0.1, "per_token_s": 0.0, "per_context_token_s": 0.0},
       "kv_capacity_tokens": 1000,
       "systems": [{"name": "rl", "scheduler": {"kind": "request_level", "max_batch_size": 1}}]}


def _md1(tmp_path: Path, **changes: object) -> Path:
    import copy

    import yaml

    data = copy.deepcopy(MD1)
    for key, value in changes.items():
        section, _, leaf = key.partition("__")
        if leaf:
            data[section][leaf] = value  # type: ignore[index]
        else:
            data[key] = value
    path = tmp_path / "md1.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_bisection_ends_between_neighbouring_floats() -> None:
    """At a tolerance below float64's resolution (1 + 1e-17 is 1) the bisection never
    ended; the command refuses such a tolerance too."""
    calls: list[float] = []

    def passes(rate: float) -> bool:
        calls.append(rate)
        assert len(calls) < 200, "still bisecting"
        return rate < 7.0

    low, high = cap._narrow(5.0, 10.0, passes, 1e-17)
    assert low < 7.0 <= high and math.nextafter(low, math.inf) == high


def test_a_tolerance_finer_than_a_search_can_reach_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["capacity", str(_md1(tmp_path)), "--slo", "e2e_p90=1",
                                   "--rel-tol", "1e-300", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "1e-06 <= rel-tol < 1" in result.output


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--replications", "0", "--replications = 0: expected at least 1"),
    ("--requests", "-3", "--requests -3: expected 0 (the scenario's) or at least 40"),
    ("--rel-tol", "1", "--rel-tol = 1: expected 1e-06 <= rel-tol < 1"),
])
def test_an_option_out_of_range_is_named_alone(tmp_path: Path, flag: str, value: str,
                                               said: str) -> None:
    """One check named all three options ('--replications 3, --requests -3, --rel-tol 0.02:
    expected replications >= 1, requests >= 0 and ...'), whichever was wrong."""
    result = runner.invoke(app, ["capacity", str(_md1(tmp_path)), "--slo", "e2e_p90=1",
                                 flag, value, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and said in result.output, result.output
    others = {"--replications", "--requests", "--rel-tol"} - {flag}
    assert not any(o in result.output for o in others), result.output


@pytest.mark.timeout(10)  # without the bound it spawned seeds until memory ran out
def test_replications_are_bounded(tmp_path: Path) -> None:
    """--replications 1e9 spawned a seed and built a job per replication before any search
    (1.2 GB in 30 s, still growing); a sweep file's replications stop at 10,000."""
    result = runner.invoke(app, ["capacity", str(_md1(tmp_path)), "--slo", "e2e_p90=1",
                                 "--replications", "1000000000", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "--replications = 1000000000: expected at most 10,000" in result.output
    with pytest.raises(ScenarioError, match="--replications = 2 over 500001 points x systems: "
                                            "1e\\+06 searches, beyond the 1,000,000"):
        cap._check_search_count(2, 500_001)
    cap._check_search_count(2, 500_000)


def test_requests_above_a_workloads_bound_are_refused_as_the_flag(tmp_path: Path) -> None:
    """--requests 100000001 was refused by the first search as 'p0000-... at 2 req/s:
    workload.num_requests = 100000001', a key the user never wrote."""
    result = runner.invoke(app, ["capacity", str(_md1(tmp_path)), "--slo", "e2e_p90=1",
                                 "--requests", "100000001", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.output.startswith("error: --requests 100000001: expected at most 100,000,000")


def test_a_system_named_twice_is_searched_once(tmp_path: Path) -> None:
    """Named twice it ran every replication twice: replications 4 of 2, and an interval
    over duplicated answers (3.5 times too narrow)."""
    scenario = scenario_from_dict(MD1)
    jobs = cap.search_jobs(scenario, tmp_path, slo_from_strings(["e2e_p90=1"]), 2,
                           cap.SearchSettings(0.1, 60), ["rl", "rl"])
    assert [(j.system, j.replication) for j in jobs] == [("rl", 0), ("rl", 1)]


@pytest.mark.parametrize(("changes", "requests"), [({"workload__num_requests": 25}, 0),
                                                   ({"warmup_s": 6.0}, 40)])
def test_a_run_that_measures_too_few_requests_is_refused(tmp_path: Path, changes: dict,
                                                         requests: int) -> None:
    """--requests 39 was refused, but a 25-request scenario (--requests 0: the scenario's)
    ran, as did 40 requests of which a warm-up leaves a handful: unjudged runs pass at any
    rate (5 and 2 times the server's 10 req/s)."""
    result = runner.invoke(app, ["capacity", str(_md1(tmp_path, **changes)), "--slo",
                                   "e2e_p90=1", "--requests", str(requests),
                                   "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "expected at least 40, enough for the saturation test" in result.output
    assert not (tmp_path / "o").exists()


def _capacity_of_grid(tmp_path: Path, parameter: str, values: str) -> Result:
    """`orcasim capacity` of a sweep over md1.yaml with one grid parameter."""
    _md1(tmp_path)
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(f"name: sw\nbase: md1.yaml\ngrid:\n  parameters:\n    {parameter}: {values}\n")
    return runner.invoke(app, ["capacity", str(sweep), "--slo", "e2e_p90=1", "--requests",
                               "60", "--out", str(tmp_path / "o")])


@pytest.mark.parametrize("parameter", ["workload.arrival.rate_per_s", "workload.num_requests"])
def test_a_grid_over_what_the_search_sets_is_refused(tmp_path: Path, parameter: str) -> None:
    """Each point's search sets the rate (and with --requests, the count) at every run: two
    points were one search, reported as two configurations."""
    result = _capacity_of_grid(tmp_path, parameter, "[50, 80]")
    assert result.exit_code == 2, result.output
    assert f"grid.parameters.{parameter}: the search sets it at every run" in result.output


@pytest.mark.parametrize("parameter, values, message", [
    ("workload.max_tokens", "[4, 1]", "workload.max_tokens = 1 is below"),
    ("warmup_s", "[0, 1000]", "warmup_s = 1000 is past the last arrival"),
])
def test_a_point_refused_before_the_search_is_named(tmp_path: Path, parameter: str, values: str,
                                                    message: str) -> None:
    """A grid point's refusal names the point, as `orcasim sweep` and `validate` name it: the
    value the scenario file does not hold (max_tokens 1 where it says 2) was named alone."""
    result = _capacity_of_grid(tmp_path, parameter, values)
    assert result.exit_code == 2, result.output
    assert f"error: point p0001-rl-r00 ({parameter}={values[4:-1]}): {message}" in result.output


def test_a_resumed_search_reads_every_points_trace(tmp_path: Path) -> None:
    """A grid over the trace: each point's file is digested in the plan, as a sweep's are, so
    a search is not resumed after one changed (only the base's was: the changed point kept
    its answer of 115.3 req/s where a fresh search answers 0)."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
            f"{0.2 * i:.1f},10,1\n" for i in range(60)))
    (tmp_path / "base.yaml").write_text(
        "name: tr\nworkload: {arrival: {kind: trace, path: a.csv}, max_tokens: 100}\n"
        "cost: {kind: linear, base_s: 0.1, per_token_s: 0.0}\nkv_capacity_tokens: 1000\n"
        "systems: [{name: rl, scheduler: {kind: request_level, max_batch_size: 1}}]\n")
    sweep = tmp_path / "sw.yaml"
    sweep.write_text("name: sw\nbase: base.yaml\ngrid:\n  parameters:\n"
                     "    workload.arrival.path: [a.csv, b.csv]\n")
    args = ["capacity", str(sweep), "--slo", "e2e_p90=1", "--requests", "0", "--replications",
            "1", "--out", str(tmp_path / "o"), "--no-plots"]
    assert runner.invoke(app, args).exit_code == 0
    (tmp_path / "b.csv").write_text((tmp_path / "b.csv").read_text().replace(",10,1\n", ",10,50\n"))
    result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 2, result.output
    assert "plan.json differs" in result.output


def test_a_resumed_search_leaves_no_earlier_failures_or_front(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """write_capacity wrote failures.csv and pareto.csv only where they applied and removed
    neither: a resumed search that succeeded, or ran without the price, kept the old ones."""
    out = tmp_path / "o"
    jobs = cap.search_jobs(scenario_from_dict(MD1), tmp_path, slo_from_strings(["e2e_p90=1"]), 1,
                           cap.SearchSettings(0.1, 60))
    cap.run_capacity(jobs, out, workers=1)
    mark_results(out, ["failures.csv", "pareto.csv", "pareto.png"])
    for name in ("failures.csv", "pareto.csv", "pareto.png"):  # as an earlier run left them
        (out / name).write_text("old")
    result = cap.run_capacity(jobs, out, workers=1, resume=True)
    cap.write_capacity(result, out, slo_from_strings(["e2e_p90=1"]), plots=False)
    assert not result.failed
    assert not any((out / name).exists() for name in ("failures.csv", "pareto.csv", "pareto.png"))
    assert (out / "capacity.csv").is_file()


def test_a_search_looks_above_a_start_that_fails_where_nothing_below_passes(tmp_path: Path) -> None:
    """A request-level batch held up to 0.5 s for 8 requests (Triton's max_queue_delay): a slow
    stream waits the whole delay (TTFT p90 0.55 s at 5 req/s), a fast one fills its batch
    at once. The search started at 5 req/s, halved down and answered 0; it now looks above
    and finds the rates that pass, and says that lower ones fail."""
    data = {**MD1, "workload": {**MD1["workload"], "num_requests": 300},
            "cost": {**MD1["cost"], "base_s": 0.05},
            "systems": [{"name": "triton", "scheduler": {"kind": "request_level",
                                                         "max_batch_size": 8,
                                                         "max_queue_delay_s": 0.5}}]}
    slo = slo_from_strings(["ttft_p90=0.3"])
    jobs = cap.search_jobs(scenario_from_dict(data), tmp_path, slo, 1, cap.SearchSettings(0.1, 300))
    result = cap.run_capacity(jobs, workers=1)
    answer = float(result.table["max_rate_per_s"].iloc[0])
    assert answer > 40, result.evaluations[["rate_per_s", "passes"]]
    lines = cap.capacity_warnings(result, slo)
    assert any("attainment rises with the load" in line for line in lines), lines


@pytest.mark.parametrize("rel_tol", [0.1, 0.3])
def test_a_coarse_tolerance_stays_within_itself_of_the_servers_ceiling(rel_tol: float) -> None:
    """D/D/1: one request every 1 / rate, each served in exactly 0.1 s, so every rate below 10
    meets e2e_p90 <= 1 and none above it is stable. The measured throughput was divided by
    1 + rel_tol as well as bisected to it: 8.44 req/s at --rel-tol 0.1 and 6.20 at 0.3 (15%
    and 38% low), with an interval whose top (9.32 on the quickstart at 0.2) lay below rates
    a finer search passed. The margin covers the measurement's noise, 2% at most: the answer
    lies within the tolerance of what it leaves."""
    data = {**MD1, "workload": {**MD1["workload"], "num_requests": 300,
                                "arrival": {"kind": "constant", "rate_per_s": 5.0}}}
    jobs = cap.search_jobs(scenario_from_dict(data), Path("."), slo_from_strings(["e2e_p90=1"]),
                           2, cap.SearchSettings(rel_tol, 300))
    result = cap.run_capacity(jobs, workers=1)
    row = result.table.iloc[0]
    ceiling = 10 / (1 + cap.MAX_THROUGHPUT_MARGIN)  # what the throughput's margin leaves
    assert ceiling / (1 + rel_tol) <= row["max_rate_per_s"] < 10, result.evaluations
    assert row["ci_high"] >= ceiling * 0.999


def test_plot_of_a_capacity_folder_with_nothing_evaluated_says_so(tmp_path: Path) -> None:
    """A folder whose evaluations.csv holds no row (every search failed) drew nothing and
    exited 0 without a word."""
    out = tmp_path / "o"
    result = runner.invoke(app, ["capacity", str(_md1(tmp_path)), "--slo", "e2e_p90=1",
                                 "--requests", "60", "--replications", "1", "--no-plots",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    evaluations = out / "evaluations.csv"
    evaluations.write_text(evaluations.read_text().splitlines()[0] + "\n")
    result = runner.invoke(app, ["plot", str(out)])
    assert result.exit_code == 0
    assert "holds nothing to draw (no rate was evaluated)" in result.output


def test_the_servers_ceiling_is_not_a_capacity() -> None:
    """A tester's case: e2e_p90 <= 1.5 at 500 requests. Replication 2 doubled 5 to exactly
    10 req/s, the ceiling, which passed: its saturated runs read the throughput as 10.006
    and 10.017 (a count over a finite window), and the interval reached 10.5. A rate within
    the search's tolerance of the measured throughput now fails, and the interval stops
    there."""
    jobs = cap.search_jobs(scenario_from_dict(MD1), Path.cwd(), slo_from_strings(["e2e_p90=1.5"]), 4,
                           cap.SearchSettings(num_requests=500))
    outcomes = [cap.search(job) for job in jobs]
    assert all(o.ok and 8.0 < o.max_rate_per_s < 10.0 / (1 + cap.DEFAULT_REL_TOL) for o in outcomes)
    table = cap.capacity_table(outcomes, jobs)
    assert table["ci_high"].iloc[0] < 10.0
    assert table["ci_high"].iloc[0] == pytest.approx(cap.measured_limit(outcomes, cap.DEFAULT_REL_TOL))


def _md1_fleet(router: str) -> dict:
    """MD1's server (10 req/s) and one three times slower (3.33 req/s) behind `router`."""
    slow = {**MD1["cost"], "base_s": 0.3}  # type: ignore[dict-item]
    system = {**MD1["systems"][0], "cluster": {  # type: ignore[index]
        "router": {"kind": router}, "replicas": [{"count": 1}, {"count": 1, "cost": slow}]}}
    return {**MD1, "systems": [system]}


def test_a_fleet_split_by_share_stops_where_its_slow_replica_does() -> None:
    """Round robin sends each of the two replicas half the arrivals: the fleet serves at
    most 2 x 3.33 = 6.67 req/s. Its saturated runs' pooled admission rate counted the quick
    replica's admissions at its own arrival rate (7.0 to 7.6 req/s), the slow replica's
    queue grew too slowly to show in 1,000 requests, and a search within a loose SLO
    answered 7.30 (a tester's finding). Behind a load-aware router the pooled rate stands:
    least_outstanding serves up to 13.3 and answers above the round robin's limit."""
    slo = slo_from_strings(["e2e_p90=100"])
    answers = {}
    for router in ("round_robin", "least_outstanding"):
        jobs = cap.search_jobs(scenario_from_dict(_md1_fleet(router)), Path.cwd(), slo, 1,
                               cap.SearchSettings(num_requests=2000))
        outcome = cap.search(jobs[0])
        assert outcome.ok, outcome.error
        answers[router] = outcome.max_rate_per_s
    assert 5.5 < answers["round_robin"] < 20 / 3, answers
    assert answers["least_outstanding"] > 11.0, answers


def test_a_group_that_fell_behind_is_measured_over_all_its_replicas() -> None:
    """Behind round robin, two A100s and an H100 (TP 2) at 40 req/s, 2,000 requests: one
    A100 was flagged, admitting 10.74 req/s, its twin admitted 11.80 unflagged. Read from the
    flagged one alone, the full-load rate was 3 x 10.74 = 32.2 and the search refused 32.2 req/s
    and above, where 33.5 keeps up within the SLOs over 12,000 requests (its A100s admit 11.15
    and 11.19). The group's mean, 11.27, is the same server on the same share."""
    replicas = pd.DataFrame({"group": [0, 0, 1], "saturated": [1.0, 0.0, 0.0],
                             "saturation_admission_rps": [10.74, 11.80, 13.20]})
    summary = {"saturated": 0.0, "saturation_admission_rps": 35.74}
    assert cap.full_load_rps(summary, replicas, True) == pytest.approx(3 * (10.74 + 11.80) / 2)
    assert math.isnan(cap.full_load_rps(summary, replicas, False))  # load-aware: pooled, not grown


def test_a_run_where_one_replica_fell_behind_measures_the_fleets_throughput() -> None:
    """least_kv reads the KV in use, not the queues: the slow replica of `_md1_fleet` keeps
    about 39% of the arrivals and the fleet falls behind near 8.7 req/s (40,000 requests:
    stable at 8.6, the slow replica's queue growing at 8.8). Its runs at 9.4 to 9.6 req/s
    flagged that replica, not the pooled queue (z 1.9 to 2.4), and measured nothing, so the
    search answered up to 9.47 (a tester's finding). A run where any replica fell behind
    admitted no more than the fleet serves at that load: its pooled admission rate bounds
    the capacity from above, whatever the router."""
    slo = slo_from_strings(["e2e_p90=100"])
    jobs = cap.search_jobs(scenario_from_dict(_md1_fleet("least_kv")), Path.cwd(), slo, 2,
                           cap.SearchSettings(num_requests=2000))
    answers = [cap.search(job).max_rate_per_s for job in jobs]
    assert all(8.0 < a < 9.0 for a in answers), answers


def _trace_md1(tmp_path: Path, num_requests: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(3)
    trace = tmp_path / "tr.csv"
    pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(0.2, 300)), "prompt_tokens": 1,
                  "output_tokens": 1}).to_csv(trace, index=False)
    workload = {"num_requests": num_requests, "arrival": {"kind": "trace", "path": str(trace)},
                "max_tokens": 2}
    return {**MD1, "workload": workload}


def test_a_trace_capped_by_num_requests_is_searched_at_the_requests_given(tmp_path: Path) -> None:
    """A trace scenario that caps itself with workload.num_requests (as `run` accepts) was
    refused at any --requests but its own: the search set arrival.max_requests beside it."""
    scenario = scenario_from_dict(_trace_md1(tmp_path, 250))
    jobs = cap.search_jobs(scenario, tmp_path, slo_from_strings(["e2e_p90=1"]), 1,
                           cap.SearchSettings(num_requests=200))
    point = cap.point_scenario(jobs[0], 3.0)
    assert point.workload.num_requests is None and point.workload.arrival.max_requests == 200
    assert cap.search(jobs[0]).ok


def test_a_traces_replications_are_said_to_be_one_sample(tmp_path: Path) -> None:
    scenario = scenario_from_dict(_trace_md1(tmp_path, 250))
    with pytest.warns(UserWarning, match=r"every replication replays the same requests, so the 3 "
                                         r"replications differ only where a system draws at random"):
        cap.search_jobs(scenario, tmp_path, slo_from_strings(["e2e_p90=1"]), 3,
                        cap.SearchSettings(num_requests=200))
    # A system prompt that a seed draws (half the requests carry it) differs between them.
    data = _trace_md1(tmp_path, 250)
    data["workload"]["system_prompt"] = {"tokens": 1, "fraction": 0.5}
    data["workload"]["max_tokens"] = 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap.search_jobs(scenario_from_dict(data), tmp_path, slo_from_strings(["e2e_p90=1"]), 3,
                        cap.SearchSettings(num_requests=200))


def test_constant_arrivals_of_constant_lengths_are_said_to_be_one_sample(tmp_path: Path) -> None:
    """Constant arrivals of constant lengths draw the same requests at every seed, so the
    replications were one run and its interval of zero width read as a certain answer,
    where a trace's said so (a tester's note). Drawn lengths differ between replications."""
    import copy

    data = copy.deepcopy(MD1)
    data["workload"]["arrival"] = {"kind": "constant", "rate_per_s": 5.0}
    with pytest.warns(UserWarning, match=r"constant arrivals of constant lengths: every "
                                         r"replication replays the same requests, so the 3 "):
        cap.search_jobs(scenario_from_dict(data), tmp_path, slo_from_strings(["e2e_p90=1"]), 3,
                        cap.SearchSettings(num_requests=100))
    data["workload"]["output_tokens"] = {"kind": "uniform", "low": 1, "high": 3}
    data["workload"]["max_tokens"] = 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap.search_jobs(scenario_from_dict(data), tmp_path, slo_from_strings(["e2e_p90=1"]), 3,
                        cap.SearchSettings(num_requests=100))


def test_each_point_of_a_grid_over_the_trace_is_searched_at_its_own_trace_s_rate(
        tmp_path: Path) -> None:
    """A grid over the trace's path shared the first trace's rate: a trace four times slower
    was offered a quarter of each rate it was labelled with (a tester's finding)."""
    data = _trace_md1(tmp_path, 250)
    data["workload"].pop("num_requests")
    slow = tmp_path / "slow.csv"
    trace = pd.read_csv(data["workload"]["arrival"]["path"])
    trace.assign(arrival_s=trace["arrival_s"] * 4).to_csv(slow, index=False)
    jobs = cap.search_jobs(scenario_from_dict(data), tmp_path, slo_from_strings(["e2e_p90=1"]), 1,
                           cap.SearchSettings(num_requests=None),
                           points=[{}, {"workload.arrival.path": str(slow)}])
    fast_knob, slow_knob = jobs[0].knob, jobs[1].knob
    assert slow_knob.rate_per_unit == pytest.approx(fast_knob.rate_per_unit / 4, rel=1e-12)
    # Each point's requests arrive at the rate it is labelled with.
    from orcasim.metrics import offered_rps
    from orcasim.run import make_requests

    for job in jobs:
        offered = offered_rps(make_requests(cap.point_scenario(job, 3.0)).arrival_s)
        assert offered == pytest.approx(3.0, rel=1e-9)


def _saturated(rate: float, admitted_rps: float) -> dict[str, float]:
    return {"rate_per_s": rate, "saturated": 1.0, "saturation_z": 10.0,
            "saturation_admission_rps": admitted_rps}


def test_the_servers_throughput_is_pooled_over_the_runs_windows() -> None:
    """A heavily overloaded run's window is milliseconds long: its admission rate is one
    iteration or none (6.64 req/s at 10,000 offered, 13.3 at 625, for a server of 11.3; a
    tester's finding). Weighted by their windows the near runs decide; none measured: inf.
    A run saturated only in the system admitted at the offered rate and measures nothing."""
    rows = [_saturated(10_000, 6.64), _saturated(625, 13.3), _saturated(12.0, 11.3),
            _saturated(14.0, 11.3), {"rate_per_s": 5.0, "saturated": 0.0,
                                     "saturation_admission_rps": 5.0},
            {**_saturated(13.0, 13.0), "saturation_z": 0.2, "in_system_z": 9.5}]
    assert 11.3 < cap.service_rate(rows) < 11.35
    assert cap.service_rate([_saturated(1e6, 0.0)]) == math.inf
    assert cap.service_rate([]) == math.inf


@pytest.mark.parametrize("start", [1e6, 1e4])
def test_a_search_from_far_above_the_throughput_comes_back_below_it(
        monkeypatch: pytest.MonkeyPatch, start: float) -> None:
    """The server serves 5 req/s and a run far above it admits nothing in its window (shorter
    than a step): from 1e6 req/s halving ran out of steps at 977 (answer 0), and a limit of
    0 divided by zero."""
    def evaluate(job: cap.SearchJob, rate: float) -> dict[str, float]:
        saturated = rate > 5.0
        return {"rate_per_s": rate, "passes": float(not saturated), "saturated": float(saturated),
                "saturation_z": 10.0 if saturated else 0.0,
                "saturation_admission_rps": 0.0 if rate > 1e5 else (5.0 if saturated else rate)}

    monkeypatch.setattr(cap, "evaluate", evaluate)
    knob = cap.RateKnob("workload.arrival.rate_per_s", 1.0, start)
    outcome = cap.search(cap.SearchJob(0, "orca", 0, 1, {}, {}, ".", knob, cap.SearchSettings()))
    assert outcome.ok, outcome.error
    limit = 5.0 / (1 + cap.DEFAULT_REL_TOL)
    assert limit / (1 + cap.DEFAULT_REL_TOL) ** 2 <= outcome.max_rate_per_s < limit


def _outcome(replication: int, low: float, high: float, limit: float | None) -> cap.SearchOutcome:
    rows = [{"rate_per_s": low, "passes": 1.0, "saturated": 0.0, "saturation_admission_rps": low,
             "output_tokens_mean": 10.0}]
    if limit is not None:
        rows.append({**_saturated(high * 2, limit * (1 + cap.DEFAULT_REL_TOL)),
                     "passes": 0.0, "output_tokens_mean": 10.0})
    return cap.SearchOutcome(f"r{replication}", 0, "orca", replication, replication, {}, True,
                             low, high, rows)


def test_the_interval_holds_the_answer_and_the_searchs_resolution() -> None:
    """Replications 10.66, 13.75 and 10.39, the second never saturated: the interval stopped
    at the others' median limit, 10.72, below the answer 11.6 (a tester's finding). And three
    replications on one grid point gave an interval of zero width, where each threshold lies
    anywhere up to its search's lowest failing rate."""
    knob = cap.RateKnob("workload.arrival.rate_per_s", 1.0, 5.0)
    data = make_scenario().model_dump(mode="json", exclude_none=True)
    jobs = [cap.SearchJob(0, "orca", r, r, {}, data, ".", knob, cap.SearchSettings()) for r in range(3)]
    outcomes = [_outcome(0, 10.66, 10.9, 10.72), _outcome(1, 13.75, 14.0, None),
                _outcome(2, 10.39, 10.6, 10.72)]
    row = cap.capacity_table(outcomes, jobs).iloc[0]
    assert row["ci_low"] <= row["max_rate_per_s"] <= row["ci_high"], row
    same = [_outcome(r, 10.0, 10.0 * (1 + cap.DEFAULT_REL_TOL) * (1 + r / 100), None)
            for r in range(3)]
    row = cap.capacity_table(same, jobs).iloc[0]
    assert row["ci_low"] == row["max_rate_per_s"] == 10.0 < row["ci_high"], row


def test_every_system_s_cost_is_checked_before_any_run() -> None:
    """A second system's missing cost file: validate and run refuse it in one line, and the
    search ran the first system, then failed the second's every run (exit 1, a folder that
    needed --force; a tester's finding)."""
    data = make_scenario().model_dump(mode="json", exclude_none=True)
    data["systems"].append({"name": "bad", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                            "cost": {"kind": "fitted", "path": "nothere.json"}})
    with pytest.raises(Exception) as err:
        cap.search_jobs(scenario_from_dict(data), Path.cwd(), slo_from_strings(["e2e_p90=3"]), 2,
                        cap.SearchSettings(num_requests=100))
    assert isinstance(err.value, cap.ScenarioError) and "nothere.json" in str(err.value), err.value


def test_each_replications_requests_are_checked_against_the_warm_up() -> None:
    """Only replication 0's requests were checked: one whose requests arrived later measured
    34 after the warm-up, below the 40 the saturation test needs (a tester's finding)."""
    from orcasim.run import make_requests

    slo = slo_from_strings(["e2e_p90=3"])
    settings = cap.SearchSettings(num_requests=100)
    for seed in range(1, 30):
        scenario = make_scenario(seed=seed)
        jobs = cap.search_jobs(scenario, Path.cwd(), slo, 5, settings, ["orca"])
        cut_s = [make_requests(cap.point_scenario(j, j.knob.start_rate_per_s)).arrival_s[
            100 - cap.MIN_SEARCH_REQUESTS] for j in jobs]
        if min(cut_s[1:]) < cut_s[0]:  # a warm-up between leaves replication 0 enough, another not
            break
    warmup_s = (min(cut_s[1:]) + cut_s[0]) / 2
    warm = make_scenario(seed=seed, warmup_s=warmup_s)
    cap.search_jobs(warm, Path.cwd(), slo, 1, settings, ["orca"])  # replication 0 has enough
    with pytest.raises(cap.ScenarioError, match=r"each run of the search measures \d+ requests"):
        cap.search_jobs(warm, Path.cwd(), slo, 5, settings, ["orca"])


def test_a_capacity_folder_whose_every_search_failed_plots_as_nothing_to_draw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluations.csv was written as an empty line, and `orcasim plot` failed on it ('empty;
    expected a CSV file with a header row'; a tester's finding): it holds its header."""
    slo = slo_from_strings(["e2e_p90=3"])
    jobs = cap.search_jobs(make_scenario(), Path.cwd(), slo, 1, cap.SearchSettings(num_requests=100),
                           ["orca"])
    monkeypatch.setattr(cap, "search", lambda job: cap.SearchOutcome.failed(job, "boom"))
    result = cap.run_capacity(jobs, workers=1)
    out = tmp_path / "o"
    out.mkdir()
    mark_results(out)
    cap.write_capacity(result, out, slo, plots=False)
    assert (out / "evaluations.csv").read_text().startswith("point,system,replication,step,")
    plotted = runner.invoke(app, ["plot", str(out)])
    assert plotted.exit_code == 0 and "holds nothing to draw" in plotted.output, plotted.output


def test_a_scenarios_own_sweep_is_searched_point_by_point(tmp_path: Path) -> None:
    """A scenario's `sweep:` was dropped without a word: one search of its base values (a
    tester's finding). Each value is a point, as a sweep file's grid is; a sweep of the rate
    the search sets (the Orca paper scenarios') is replaced by the search, and said."""
    import pandas as pd

    path = _md1(tmp_path, sweep={"parameter": "cost.base_s", "values": [0.1, 0.05]})
    result = runner.invoke(app, ["capacity", str(path), "--slo", "e2e_p90=1", "--requests", "60",
                                 "--replications", "1", "--out", str(tmp_path / "o"), "--no-plots"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "o" / "capacity.csv")
    assert table["cost.base_s"].tolist() == [0.1, 0.05]
    slow, fast = table["max_rate_per_s"].tolist()
    assert 0 < slow < 10 < fast < 20 and fast > 1.5 * slow
    path = _md1(tmp_path, sweep={"parameter": "workload.arrival.rate_per_s", "values": [1, 2]})
    with pytest.warns(UserWarning, match="sweep.parameter = 'workload.arrival.rate_per_s': the search sets it"):
        result = runner.invoke(app, ["capacity", str(path), "--slo", "e2e_p90=1", "--requests", "60",
                                     "--replications", "1", "--out", str(tmp_path / "o2"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(tmp_path / "o2" / "capacity.csv")) == 1


@pytest.mark.parametrize("sweep_file", [False, True])
def test_a_sweep_over_a_kind_starts_the_object_again_as_a_sweep_does(tmp_path: Path,
                                                                     sweep_file: bool) -> None:
    """A point that changes a scheduler's `kind` starts the scheduler again from the keys
    given, as `orcasim sweep` and `orcasim run` of the same file do: the search kept the old
    kind's defaults and failed (request_level's max_queue_delay_s is not iteration_level's;
    a tester's finding; in a sweep file's grid too, whose base the search read with every
    default set). One-token requests one at a time are one M/D/1 queue either way."""
    import pandas as pd

    values = ["request_level", "iteration_level"]
    if sweep_file:
        _md1(tmp_path)
        path = tmp_path / "sw.yaml"
        path.write_text("name: sw\nbase: md1.yaml\ngrid:\n  parameters:\n"
                        f"    systems[0].scheduler.kind: [{', '.join(values)}]\n")
    else:
        path = _md1(tmp_path, sweep={"parameter": "systems[0].scheduler.kind", "values": values})
    result = runner.invoke(app, ["capacity", str(path), "--slo", "e2e_p90=1", "--requests", "60",
                                 "--replications", "1", "--out", str(tmp_path / "o"), "--no-plots"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "o" / "capacity.csv")
    assert table["systems[0].scheduler.kind"].tolist() == ["request_level", "iteration_level"]
    request_level, iteration_level = table["max_rate_per_s"].tolist()
    assert iteration_level == pytest.approx(request_level, rel=0.05)


def test_a_count_given_with_set_is_refused_before_a_bad_price_or_target_rate(
        tmp_path: Path) -> None:
    """The command's refusals in the order it has always made them: a --set count that
    --requests replaces before --price-per-gpu-hour or --target-rate (bbeecc1's refactor
    checked those first, and named the price)."""
    args = ["capacity", str(scenario_file(tmp_path)), "--slo", "e2e_p90=1", "--out",
            str(tmp_path / "o"), "--set", "workload.num_requests=500"]
    for flag in ("--price-per-gpu-hour", "--target-rate"):
        result = runner.invoke(app, [*args, flag, "-1"])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: --set workload.num_requests=500: "), result.output


def test_a_count_of_requests_given_with_set_is_refused_where_requests_replaces_it(
        tmp_path: Path) -> None:
    """`--set workload.num_requests=500` ran --requests' 2,000 at every rate without a word
    (a tester's finding); with --requests 0 the scenario's count, overrides included, runs.
    A sweep file's own `set:` of it (written for `orcasim sweep`) is warned of."""
    scenario = scenario_file(tmp_path)
    args = ["capacity", str(scenario), "--slo", "e2e_p90=1", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*args, "--set", "workload.num_requests=500"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --set workload.num_requests=500: the search runs "
                                    "--requests 2000 requests at every rate"), result.output
    grid = tmp_path / "g.yaml"
    grid.write_text(f"name: g\nbase: {scenario.name}\nset: [workload.num_requests=500]\n"
                    "grid: {parameters: {warmup_s: [0]}}\n")
    result = runner.invoke(app, ["capacity", str(grid), "--slo", "e2e_p90=1", *QUICK, "--out",
                                 str(tmp_path / "g")])
    assert result.exit_code == 0, result.output
    assert "warning: g.yaml's set: workload.num_requests=500 is not used: the search runs " \
           "--requests 200 requests" in result.output, result.output


def test_a_trace_shorter_than_the_searchs_requests_names_requests(tmp_path: Path) -> None:
    """It said 'workload.arrival.max_requests = 2000, but tr.csv holds 300 requests', a
    key the user never wrote: the search set it from --requests (a tester's finding)."""
    scenario = scenario_from_dict(_trace_md1(tmp_path, 250))
    with pytest.warns(UserWarning) as caught:
        cap.search_jobs(scenario, tmp_path, slo_from_strings(["e2e_p90=1"]), 1,
                        cap.SearchSettings(num_requests=2000))
    said = [str(w.message) for w in caught if "holds 300 requests" in str(w.message)]
    assert said and all(s.startswith("--requests 2000, but ") for s in said), said


def test_an_interrupted_search_prints_a_resume_command_to_paste(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It printed 'orcasim capacity SPEC --out DIR --resume (with the same options)': no
    command to paste, where a resume without the run's --slo or --requests is refused."""
    import signal

    def interrupt(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cap, "run_capacity", interrupt)
    monkeypatch.setattr(signal, "signal", lambda *_args: None)  # the command ignores Ctrl-C
    spec, out = scenario_file(tmp_path), tmp_path / "cap"
    result = runner.invoke(app, ["capacity", str(spec), "--out", str(out), "--slo",
                                 "ttft_p90<=0.5", "--requests", "300", "--replications", "2",
                                 "--set", "seed=3", "--no-plots"])
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().endswith(
        f"Resume with: orcasim capacity {spec} --slo 'ttft_p90<=0.5' --replications 2 "
        f"--requests 300 --rel-tol 0.02 --no-plots --out {out} --set seed=3 --resume"), result.stderr


def test_a_rate_whose_short_run_completes_below_its_arrivals_fails() -> None:
    """The saturation tests need a queue to grow long enough to see: over --requests 40,
    MD1's server (10 req/s at most; within e2e_p90 <= 1 up to 8.82 by M/D/1's waiting-time
    distribution) read queue z 1.6 at 20 req/s, and 10 replications answered 12.37 on average,
    up to 15.42. A run that completes under 0.9 of its arrivals while they come does not keep
    up (the sweep's rule, `keeps_up`), and its completions measure the server at full load:
    they answer 8.9 now (9.95 on the first alone), and each answer's run kept up."""
    jobs = cap.search_jobs(scenario_from_dict(MD1), Path("."), slo_from_strings(["e2e_p90=1"]),
                           10, cap.SearchSettings(num_requests=40))
    result = cap.run_capacity(jobs, workers=2)
    assert not result.failed
    assert result.table["max_rate_per_s"].iloc[0] == pytest.approx(MD1_E2E_P90_1_RPS, rel=0.1)
    tried = result.evaluations
    passed = tried.loc[tried["passes"] == 1]
    # Each passing run kept up, or was too short to measure its served rate (NaN).
    assert ((passed["kept_up"] == 1) | passed["served_rps"].isna()).all()
    assert passed["kept_up"].isna().eq(passed["served_rps"].isna()).all()


def test_a_run_too_short_to_measure_its_served_rate_is_not_said_to_keep_up() -> None:
    """40 requests at 1,000 req/s to a server of 10 req/s arrive within one request's
    latency: no served rate is measured (NaN), and the row said kept_up 1.0 beside it (the
    review10 tester's finding); the saturation test fails the run either way."""
    jobs = cap.search_jobs(scenario_from_dict(MD1), Path("."), slo_from_strings(["e2e_p90=100"]),
                           1, cap.SearchSettings(num_requests=40))
    row = cap.evaluate(jobs[0], 1000.0)
    assert np.isnan(row["served_rps"]) and np.isnan(row["kept_up"])
    assert row["passes"] == 0.0 and row["saturated"] == 1.0
    assert cap.evaluate(jobs[0], 12.0)["kept_up"] == 0.0  # measured, and behind


def test_a_run_that_did_not_keep_up_measures_the_full_load_rate() -> None:
    """Failed on keeping up alone, a run measured nothing: GPT-3 175B orca-bs16 over
    --requests 300 failed 8.0 req/s so (6.75 served), never saturated a queue, and passed 7.42
    where its saturated runs admit 6.7 to 7.1."""
    assert cap._full_load_or_served(math.nan, 6.75, kept=False, admitted=False) == 6.75
    assert math.isnan(cap._full_load_or_served(math.nan, 6.75, kept=True, admitted=False))
    # a grown queue's admissions
    assert cap._full_load_or_served(7.0, 6.75, kept=False, admitted=False) == 7.0
    # Every arrival admitted at once: behind by its latency while its running set fills.
    assert math.isnan(cap._full_load_or_served(math.nan, 35.7, kept=False, admitted=True))


def test_admissions_keep_up_by_the_keeps_up_rule() -> None:
    def summary(arrived: float, admitted: float) -> dict[str, float]:
        return {"saturation_arrival_rps": arrived, "saturation_admission_rps": admitted}

    assert cap.admissions_kept_up(summary(139.1, 134.7))  # 0.97: the running set took them
    assert cap.admissions_kept_up(summary(10.0, 9.0))  # the rule's own 0.9, inclusive
    assert not cap.admissions_kept_up(summary(15.0, 10.0))  # a server busy throughout
    assert not cap.admissions_kept_up(summary(math.nan, 9.0))  # unmeasured: as before the test
    assert not cap.admissions_kept_up(summary(10.0, math.nan))


def test_a_request_turned_away_is_no_load_to_keep_up_with() -> None:
    """A request rejected as never fitting is never served: counted as offered, a server
    answering every other one at once read 0.8 of its load where a fifth were turned away,
    and failed every rate however light."""
    arrival_s = np.arange(100, dtype=np.float64) / 10.0
    rejected = np.arange(100) % 5 == 0
    reqs = pd.DataFrame({"arrival_s": arrival_s, "rejected": rejected,
                         "finish_s": np.where(rejected, np.nan, arrival_s + 0.05)})
    offered, served = cap.offered_and_served_rps(reqs, 0.0)
    assert offered == pytest.approx(99 / 9.9 * 0.8)
    assert served == pytest.approx(offered, rel=0.02)


def test_a_search_from_where_no_run_admits_a_request_in_its_window_comes_back() -> None:
    """From 1e7 req/s, MD1 over --requests 100: ten halvings end at 9,766 req/s, 10 ms of
    arrivals in which the server (10 req/s) admits none, so no run measured its throughput,
    and the search answered 0, saying no rate met the SLOs, where 8.8 req/s meets
    e2e_p90 <= 1. Every run completed its requests at 10 req/s: halved down from that, it
    finds the rate."""
    data = {**MD1, "workload": {**MD1["workload"],  # type: ignore[dict-item]
                                "arrival": {"kind": "poisson", "rate_per_s": 1e7}}}
    jobs = cap.search_jobs(scenario_from_dict(data), Path("."), slo_from_strings(["e2e_p90=1"]),
                           1, cap.SearchSettings(num_requests=100))
    outcome = cap.search(jobs[0])
    assert outcome.ok, outcome.error
    assert 5.0 < outcome.max_rate_per_s < 10.0, outcome.max_rate_per_s
    assert cap.completed_rps([{"rate_per_s": 1e4, "throughput_rps": 10.0},
                              {"rate_per_s": 2e4, "throughput_rps": float("nan")}]) == 10.0
    assert cap.completed_rps([{"rate_per_s": 1e4}]) == math.inf


def test_a_run_that_admitted_nothing_in_its_window_measures_nothing() -> None:
    """MD1 from 1e6 req/s over --requests 100: of the runs at 7,813 to 977 req/s (windows of
    10 to 77 ms, under one 0.1 s service) all but one admitted none; pooled with them as
    zeros, that one's 13.05 req/s read 6.9 and the search answered 7.04 over 3 replications,
    where from 5 req/s it answers 9.44."""
    rows = [_saturated(r, 0.0) for r in (7812.5, 3906.25, 1953.125)] + [_saturated(976.5625, 13.05)]
    assert cap.service_rate(rows) == pytest.approx(13.05)
    data = {**MD1, "workload": {**MD1["workload"],  # type: ignore[dict-item]
                                "arrival": {"kind": "poisson", "rate_per_s": 1e6}}}
    jobs = cap.search_jobs(scenario_from_dict(data), Path("."), slo_from_strings(["e2e_p90=1"]),
                           3, cap.SearchSettings(num_requests=100))
    result = cap.run_capacity(jobs, workers=2)
    assert result.table["max_rate_per_s"].iloc[0] > 8.5, result.table


def test_a_tail_judged_on_a_handful_of_requests_is_said() -> None:
    """capadv's finding: over --requests 300 a p99 target has 3 requests above it a run, and
    an M/D/1 server with e2e_p99 <= 2 (8.856 req/s) answered 9.5; at p90 over 300 and p99
    over 2,000 the intervals held the truth."""
    slo = slo_from_strings(["e2e_p99=2", "ttft_p90=1", "tpot_p100=1"])
    lines = cap.tail_warnings(slo, 300)
    assert len(lines) == 1 and lines[0].startswith("e2e_p99 is judged on 300 requests a run, "
                                                   "about 3 of them above its percentile")
    assert "--requests 1,000 or more put 10 above it" in lines[0]
    assert cap.tail_warnings(slo, 2000) == []  # 20 above the p99
    assert cap.tail_warnings(slo, None) == []  # a count the command does not know
    assert len(cap.tail_warnings(slo_from_strings(["e2e_p95=2"]), 100)) == 1  # 5 above
    assert cap.tail_warnings(slo_from_strings(["e2e_p95=2"]), 200) == []  # 10 above: enough
    assert cap.tail_warnings(slo_from_strings(["e2e_p90=2"]), 100) == []  # exactly 10 above
    assert "--requests 10,000 or more" in cap.tail_warnings(slo_from_strings(["e2e_p99.9=2"]), 2000)[0]
