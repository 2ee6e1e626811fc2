"""End-to-end runs: determinism, the paper's qualitative claims C1/C2, and the frames' schema."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orcasim import run_scenario
from orcasim.config import ScenarioError
from orcasim.scenario import load_scenario
from orcasim.warmup import counted, measured_requests
from tests.conftest import make_scenario

# Orca's C1/C2 at moderate load: "well below" means at most this fraction of request-level.
C1_NORMALIZED_LATENCY_RATIO = 0.8
C2_QUEUE_DELAY_RATIO = 0.2

REQUEST_COLUMNS = [
    "id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "prompt_tokens",
    "output_tokens", "queue_delay_s", "ttft_s", "tpot_s", "e2e_s", "normalized_latency_s_per_token",
    "rejected", "preemptions", "cached_tokens", "prefill_saved_tokens",
]


def test_same_seed_gives_identical_results() -> None:
    a, b = run_scenario(make_scenario()), run_scenario(make_scenario())
    for name in a.systems:
        pd.testing.assert_frame_equal(a.systems[name].requests, b.systems[name].requests)
        pd.testing.assert_frame_equal(a.systems[name].iterations, b.systems[name].iterations)
        assert a.systems[name].summary == pytest.approx(b.systems[name].summary, nan_ok=True)
    c = run_scenario(make_scenario(seed=8))
    assert not np.array_equal(c.systems["orca"].requests["arrival_s"],
                              a.systems["orca"].requests["arrival_s"])


def test_systems_see_the_same_requests() -> None:
    r = run_scenario(make_scenario())
    a, b = (r.systems[n].requests for n in ("request-level", "orca"))
    pd.testing.assert_frame_equal(a[["arrival_s", "prompt_tokens", "output_tokens"]],
                                  b[["arrival_s", "prompt_tokens", "output_tokens"]])


def test_request_rows_are_consistent() -> None:
    r = run_scenario(make_scenario()).systems
    for res in r.values():
        df = res.requests
        assert list(df.columns) == REQUEST_COLUMNS
        assert df["finish_s"].notna().all()
        assert (df["first_scheduled_s"] >= df["arrival_s"]).all()
        assert (df["first_token_s"] > df["first_scheduled_s"]).all()
        assert (df["finish_s"] >= df["first_token_s"]).all()
        assert res.summary["requests_completed"] == len(df)
    rl = r["request-level"].requests
    # Static batches deliver every token when the batch ends.
    assert (rl["first_token_s"] == rl["finish_s"]).all()


def test_iteration_rows_account_for_all_tokens() -> None:
    sc = make_scenario()
    res = run_scenario(sc).systems["orca"]
    reqs = res.requests
    # Orca computes each prompt once and one token per later iteration: p + (o - 1) per request.
    expected = int((reqs["prompt_tokens"] + reqs["output_tokens"] - 1).sum())
    assert int(res.iterations["tokens"].sum()) == expected


@pytest.mark.validation
def test_paper_claims_c1_c2_on_default_scenario() -> None:
    """Iteration-level median normalized latency and queue delay are well below request-level."""
    sc = load_scenario("scenarios/quickstart.yaml")
    s = run_scenario(sc).summary_frame()
    rl, orca = s.loc["request-level"], s.loc["orca"]
    assert orca["normalized_latency_s_per_token_p50"] < (
        C1_NORMALIZED_LATENCY_RATIO * rl["normalized_latency_s_per_token_p50"])
    assert orca["queue_delay_s_p50"] < C2_QUEUE_DELAY_RATIO * rl["queue_delay_s_p50"]


def test_warmup_drops_early_requests() -> None:
    sc = make_scenario(warmup_s=20.0)
    res = run_scenario(sc).systems["orca"]
    kept = int((res.requests["arrival_s"] >= 20.0).sum())
    assert res.summary["requests_completed"] == kept < len(res.requests)


def test_a_request_arriving_at_the_warm_up_counts_everywhere() -> None:
    """The warm-up rule lives in `orcasim.warmup`: the summary, the SLO and the saturation
    test all count a request that arrives exactly at `warmup_s`."""
    arrival_s = run_scenario(make_scenario()).systems["orca"].requests["arrival_s"]
    warmup_s = float(arrival_s.iloc[10])
    sc = make_scenario(warmup_s=warmup_s, slo={"targets": ["e2e_p99 <= 1000"]})
    res = run_scenario(sc).systems["orca"]
    kept = len(res.requests) - 10
    assert res.summary["requests_completed"] == kept
    assert res.summary["slo_attainment"] == 1.0
    assert len(measured_requests(res.requests, warmup_s)) == kept
    assert int(counted(res.requests["arrival_s"].to_numpy(), warmup_s).sum()) == kept


def test_the_python_api_takes_a_mapping_and_one_override_string() -> None:
    import copy

    from tests.conftest import BASE

    by_mapping = run_scenario(copy.deepcopy(BASE), "workload.num_requests=20")
    assert by_mapping.summary_frame()["requests_completed"].tolist() == [20.0, 20.0]
    by_path = run_scenario(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml",
                           "workload.num_requests=30")
    assert by_path.summary_frame()["requests_completed"].tolist() == [30.0, 30.0]


def test_overrides_on_a_scenario_object_are_checked_as_a_files() -> None:
    """They make a new scenario from its keys: the message used to suggest model_copy, which
    skips the checks (seed -5 then failed inside numpy)."""
    scenario = load_scenario(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml")
    assert run_scenario(scenario, "workload.num_requests=20").summary_frame()[
        "requests_completed"].tolist() == [20.0, 20.0]
    with pytest.raises(ScenarioError, match="seed = -5: Input should be greater than or equal"):
        run_scenario(scenario, "seed=-5")


def test_load_scenario_takes_one_override_alone_as_run_scenario_does() -> None:
    """A notebook's `load_scenario(path, "seed=2")` was read character by character and
    refused as "override 's': expected KEY=VALUE" (found testing the Python API)."""
    path = Path(__file__).parent.parent / "scenarios" / "quickstart.yaml"
    assert load_scenario(path, "workload.num_requests=20").workload.num_requests == 20
    with pytest.raises(ScenarioError, match=r"seed = -5: Input should be greater than or equal"):
        load_scenario(path, "seed=-5")


@pytest.mark.parametrize(("scenario", "overrides", "message"), [
    (None, (), r"^scenario = None: expected a Scenario, a mapping of its keys or a YAML file's path$"),
    (3, (), r"^scenario = 3: expected a Scenario"),
    ("QUICKSTART", {"seed": 3}, r"^overrides = \{'seed': 3\}: expected KEY=VALUE strings, one alone or a list"),
    ("QUICKSTART", 3, r"^overrides = 3: expected KEY=VALUE strings"),
    ("QUICKSTART", [("seed", 3)], r"^overrides = \[\('seed', 3\)\]: expected KEY=VALUE strings"),
])
def test_a_wrong_type_from_python_is_named_as_the_argument_it_is(scenario: object, overrides: object,
                                                                 message: str) -> None:
    """run_scenario(None) raised os.fspath's TypeError ("expected str, bytes or
    os.PathLike object, not NoneType"), overrides=3 "'int' object is not iterable", and a
    dict of overrides "override 'seed': expected KEY=VALUE" of its key (found testing the
    Python API as a notebook would)."""
    if scenario == "QUICKSTART":
        scenario = Path(__file__).parent.parent / "scenarios" / "quickstart.yaml"
    with pytest.raises(ScenarioError, match=message):
        run_scenario(scenario, overrides)  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=r"^path = None: expected a YAML file's path"):
        load_scenario(None)  # type: ignore[arg-type]


def test_a_base_dir_that_is_no_path_is_named() -> None:
    """run_scenario(path, base_dir=3) raised "unsupported operand type(s) for /: 'int' and
    'PosixPath'" at its first data file (found calling it from Python, left alone by earlier
    reviews): refused by the argument's name before anything is read."""
    path = Path(__file__).parent.parent / "scenarios" / "models" / "expert_parallel.yaml"
    with pytest.raises(ScenarioError, match=r"^base_dir = 3: expected the folder its data paths "
                                            r"resolve from \(str or Path\)$"):
        run_scenario(path, "workload.num_requests=5", base_dir=3)  # type: ignore[arg-type]


def test_a_loaded_scenario_keeps_its_folder_for_relative_paths(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from sweep_files import write_trace_scenario

    from orcasim.scenario import load_scenario

    folder = tmp_path / "here"
    write_trace_scenario(folder)
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    scenario = load_scenario(folder / "s.yaml")
    assert scenario.source_dir == folder.resolve()
    assert run_scenario(scenario).systems["a"].summary["requests_completed"] == 2
    # An empty base_dir is the default, as before this session's path checks: Path("") is
    # truthy and read the data from the working folder, where the trace is not.
    assert run_scenario(scenario, base_dir="").systems["a"].summary["requests_completed"] == 2  # type: ignore[arg-type]


SCENARIOS = Path(__file__).parent.parent / "scenarios"


def _none_calls() -> list[tuple[str, object, type[Exception], str]]:
    from orcasim import compare, fidelity, plots, regression, render
    from orcasim.sweeps import load_sweep, runner, spec

    quickstart = SCENARIOS / "quickstart.yaml"
    return [
        ("run_scenario_sweep(None, dir)", lambda: runner.run_scenario_sweep(None, SCENARIOS),
         ScenarioError, r"^scenario = None: expected a Scenario"),
        ("build_sweep(spec, None)", lambda: spec.build_sweep(
            load_sweep(SCENARIOS / "sweeps" / "orca_gpt3_13b.yaml").spec, None),
         ScenarioError, r"^base_path = None: expected the base scenario file's path"),
        ("run_sweep_in_memory(None)", lambda: runner.run_sweep_in_memory(None),
         ScenarioError, r"^sweep = None: expected a Sweep"),
        ("fidelity_table(runs=None)", lambda: fidelity.fidelity_table(quickstart, None, "orca"),
         ScenarioError, r"^runs = None: expected a real run's log path"),
        ("fidelity_table(systems=None)", lambda: fidelity.fidelity_table(quickstart, "x.csv", None),
         ScenarioError, r"^systems = None: expected a system's name"),
        ("run_figures(None)", lambda: plots.run_figures(None),
         TypeError, r"^result = None \(NoneType\): expected a RunResult"),
        ("latency_vs_throughput(None)", lambda: plots.latency_vs_throughput(None),
         TypeError, r"^the sweep table = None \(NoneType\): expected a pandas DataFrame$"),
        ("latency_cdfs(None)", lambda: plots.latency_cdfs(None),
         TypeError, r"^the requests table = None \(NoneType\): expected a pandas DataFrame$"),
        ("compare.load_pair(None, None)", lambda: compare.load_pair(None, None),
         ScenarioError, r"^path_a = None: expected a results folder"),
        ("render.write_plots(None)", lambda: render.write_plots(None),
         ScenarioError, r"^results_dir = None: expected a results folder"),
        ("regression.check(None)", lambda: regression.check(None),
         ScenarioError, r"^scenario_dir = None: expected a folder of regression scenarios"),
        # The lower-level helpers those two are made of, each its own public name.
        *[(f"compare.{name}(None)", partial(getattr(compare, name), None), ScenarioError,
           r"^path = None: expected a ") for name in ("load_metrics", "read_sweep_table",
                                                    "metrics_kind", "read_metrics", "is_baseline")],
        ("compare.deltas(None, {})", lambda: compare.deltas(None, {}),  # type: ignore[arg-type]
         ScenarioError, r"^a = None: expected metrics by label"),
        ("compare.deltas({}, None)", lambda: compare.deltas({}, None),  # type: ignore[arg-type]
         ScenarioError, r"^b = None: expected metrics by label"),
        ("compare.changed_rows(None)", lambda: compare.changed_rows(None),  # type: ignore[arg-type]
         ScenarioError, r"^frame = None: expected the table `deltas` returns"),
        ("compare_to_baseline(s, None, {})", lambda: regression.compare_to_baseline("s", None, {}),  # type: ignore[arg-type]
         ScenarioError, r"^baseline = None: expected metrics by label"),
        ("compare_to_baseline(s, {}, None)", lambda: regression.compare_to_baseline("s", {}, None),  # type: ignore[arg-type]
         ScenarioError, r"^now = None: expected metrics by label"),
        ("compare_to_baseline(None, ...)", lambda: regression.compare_to_baseline(None, {}, {}),  # type: ignore[arg-type]
         ScenarioError, r"^scenario = None: expected the scenario's name"),
        *[(f"regression.{name}(None)", partial(getattr(regression, name), None), ScenarioError,
           r"^(path|scenario_dir) = None: expected a ")
          for name in ("run_regression", "read_baseline", "regression_scenarios")],
    ]


@pytest.mark.parametrize("case", range(len(_none_calls())), ids=[c[0] for c in _none_calls()])
def test_none_where_the_python_api_expects_a_path_frame_or_object_is_named(case: int) -> None:
    """Each raised a TypeError or AttributeError from deep inside ("'NoneType' object has no
    attribute 'resolve'", "... 'empty'", "expected str, bytes or os.PathLike object") (found
    passing None to the functions the README and the notebooks call)."""
    _, call, error, message = _none_calls()[case]
    with pytest.raises(error, match=message) as caught:
        call()  # type: ignore[operator]
    assert "\n" not in str(caught.value)


# Requests of 600-700 tokens against a scenario's 512 KV tokens, on fleets whose groups or
# pools give a capacity of their own (`fits`: 1,024 holds them, 512 does not).
_LONG = {"workload.prompt_tokens": {"kind": "uniform", "low": 600, "high": 700},
         "workload.output_tokens": {"kind": "constant", "value": 4},
         "workload.max_tokens": 800, "workload.num_requests": 12}
_PAGED = {"kind": "paged", "max_num_seqs": 4, "max_num_batched_tokens": 1024}


@pytest.mark.parametrize(("scenario_kv", "cluster", "fits"), [
    (512, {"replicas": [{"count": 2, "kv_capacity_tokens": 1024}]}, True),
    (512, {"replicas": [{"count": 1}, {"count": 1, "kv_capacity_tokens": 1024}],
           "router": {"kind": "least_outstanding"}}, True),
    (1024, {"replicas": [{"count": 2, "kv_capacity_tokens": 512}]}, False),
    (512, {"prefill": {"count": 1, "kv_capacity_tokens": 1024},
           "decode": {"count": 1, "kv_capacity_tokens": 1024}, "link": {"kind": "nvlink"}}, True),
    (1024, {"prefill": {"count": 1}, "decode": {"count": 1, "kv_capacity_tokens": 512},
            "link": {"kind": "nvlink"}}, False),
])
def test_check_run_reads_each_groups_own_kv_capacity(scenario_kv: int, cluster: dict,
                                                     fits: bool) -> None:
    """`orcasim validate`'s "some request fits" asks each replica's own KV memory, as the run
    does: it refused a fleet of 1,024-token replicas under a scenario's 512 that runs every
    request (and passed 512-token replicas under a scenario's 1,024 that the run refuses)."""
    from orcasim.run import check_run

    sc = make_scenario(**_LONG, kv_capacity_tokens=scenario_kv,
                       systems=[{"name": "fleet", "scheduler": _PAGED, "cluster": cluster}])
    if fits:
        assert check_run(sc) == 12
        assert run_scenario(sc).systems["fleet"].summary["requests_completed"] > 0
    else:
        with pytest.raises(ScenarioError, match="fleet: every request is too large"):
            check_run(sc)
