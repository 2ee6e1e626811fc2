"""A cluster of replicas behind a router, against theory and its own invariants.

* `random` routing of a Poisson stream over N identical replicas thins it into N Poisson
  streams at lambda / N: each replica is an M/D/1 queue, whose mean wait is
  Pollaczek-Khinchine's (the tolerance of tests/test_queueing_theory.py).
* At equal load, mean latency orders random >= round_robin >= least_outstanding (join
  the shortest queue), on several seeds.
* Little's law holds per replica and for the cluster.
* Nothing is lost: every request finishes exactly once, on one replica, and each replica
  computes exactly its own requests' tokens (hypothesis, across routers and pool sizes).
"""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.cluster import ClusterConfig
from orcasim.config import ScenarioError
from orcasim.cost.catalog import ModelSpec, model_spec
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.fleet import (
    BuiltCosts,
    ReplicaSpec,
    build_fleet,
    built_models,
    cost_models,
    model_label,
)
from orcasim.requests import Requests
from orcasim.results import write_run
from orcasim.run import SystemResult, run_scenario
from orcasim.scenario import Scenario, scenario_from_dict
from orcasim.schedulers.paged import PagedConfig
from tests.conftest import BASE, SLOW_REPLICA_FLEET, examples, make_scenario, requests_in_both_modes
from tests.test_queueing_theory import LITTLE_REL_TOL, PK_REL_TOL, pk_mean_wait_s

ROUTERS = ("random", "round_robin", "least_outstanding", "least_tokens", "least_kv",
           "power_of_two", "session")
NUM_REPLICAS = 4
PER_REPLICA_RATE_PER_S = 0.5
SERVICE_S = 1.0  # base 0.5 s + 50 prompt tokens at 0.01 s: one iteration per request
REPLICATIONS = 4
REQUESTS_PER_REPLICATION = 40_000
WARMUP_REQUESTS = 2_000


def _mdn(router: str, seed: int, num_requests: int, rate_per_s: float, prompt: dict) -> dict:
    return {
        "seed": seed, "workload.num_requests": num_requests,
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
        "workload.prompt_tokens": prompt,
        "workload.output_tokens": {"kind": "constant", "value": 1},
        "workload.max_tokens": 200,
        "cost": {"kind": "linear", "base_s": 0.5, "per_token_s": 0.01},
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 1},
                     "cluster": {"replicas": NUM_REPLICAS, "router": {"kind": router}}}],
    }


@pytest.mark.validation
def test_random_routing_gives_each_replica_poisson_at_its_share() -> None:
    waits = []
    for seed in range(REPLICATIONS):
        scenario = make_scenario(**_mdn("random", seed, REQUESTS_PER_REPLICATION,
                                        NUM_REPLICAS * PER_REPLICA_RATE_PER_S,
                                        {"kind": "constant", "value": 50}))
        delay = run_scenario(scenario).systems["c"].requests["queue_delay_s"].to_numpy()
        waits.append(delay[WARMUP_REQUESTS:].mean())
    expected = pk_mean_wait_s(PER_REPLICA_RATE_PER_S, np.array([SERVICE_S]), np.ones(1))
    got = float(np.mean(waits))
    assert abs(got - expected) / expected < PK_REL_TOL, (got, expected)


@pytest.mark.validation
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_join_the_shortest_queue_orders_the_routers(seed: int) -> None:
    """Utilisation 0.8 with variable service (prompts of 1 to 100 tokens)."""
    rate_per_s = 0.8 * NUM_REPLICAS / SERVICE_S
    e2e = {}
    for router in ("random", "round_robin", "least_outstanding"):
        scenario = make_scenario(**_mdn(router, seed, 8_000, rate_per_s,
                                        {"kind": "uniform", "low": 1, "high": 100}))
        e2e[router] = run_scenario(scenario).systems["c"].summary["e2e_s_mean"]
    assert e2e["random"] >= e2e["round_robin"] >= e2e["least_outstanding"], e2e


@pytest.mark.parametrize("router", ROUTERS)
def test_littles_law_per_replica_and_for_the_cluster(router: str) -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 4000,
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 16},
                     "cluster": {"replicas": 3, "router": {"kind": router}}}],
    })
    result = run_scenario(scenario).systems["c"]
    assert result.summary["little_rel_error"] < LITTLE_REL_TOL, result.summary
    assert result.replicas is not None and len(result.replicas) == 3
    assert (result.replicas["little_rel_error"] < LITTLE_REL_TOL).all(), result.replicas
    assert result.replicas["requests_routed"].sum() == 4000


@settings(max_examples=examples(30), deadline=None)
@given(
    router=st.sampled_from(ROUTERS),
    num_replicas=st.integers(1, 5),
    scheduler=st.sampled_from(["iteration_level", "chunked", "request_level"]),
    rate_per_s=st.floats(1.0, 40.0),
    mode=st.sampled_from(["fast", "reference"]),
    seed=st.integers(0, 2**16),
)
def test_nothing_is_lost(router: str, num_replicas: int, scheduler: str, rate_per_s: float,
                         mode: str, seed: int) -> None:
    keys = {"iteration_level": {"kind": "iteration_level", "max_batch_size": 8},
            "chunked": {"kind": "chunked", "chunk_size_tokens": 128},
            "request_level": {"kind": "request_level", "max_batch_size": 4}}[scheduler]
    scenario = make_scenario(**{
        "seed": seed, "workload.num_requests": 120, "engine.mode": mode,
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
        "kv_capacity_tokens": 100_000,
        "systems": [{"name": "c", "scheduler": keys,
                     "cluster": {"replicas": num_replicas, "router": {"kind": router}}}],
    })
    result = run_scenario(scenario).systems["c"]
    reqs, iters = result.requests, result.iterations
    assert reqs["finish_s"].notna().all()
    assert reqs["replica"].between(0, num_replicas - 1).all()
    for i in range(num_replicas):
        mine, rows = reqs[reqs["replica"] == i], iters[iters["replica"] == i]
        if scheduler == "request_level":  # a static batch computes its members' lengths
            continue
        # Each request computes its prompt once and one token per later output token.
        expected = int((mine["prompt_tokens"] + mine["output_tokens"] - 1).sum())
        assert int(rows["tokens"].sum()) == expected, i


def test_a_heterogeneous_fleet_sends_more_to_the_faster_replicas() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 3000,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 14.0},
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 8},
                     "cluster": {"router": {"kind": "least_outstanding"}, "replicas": [
                         {"count": 2},
                         {"count": 1, "cost": {"kind": "linear", "base_s": 0.04,
                                               "per_token_s": 4.0e-5}},
                     ]}}],
    })
    replicas = run_scenario(scenario).systems["c"].replicas
    assert replicas is not None
    routed = replicas["requests_routed"].to_numpy()
    assert routed[0] > routed[2] and routed[1] > routed[2], routed


def test_replicas_csv_says_what_each_replica_of_a_mixed_fleet_runs(tmp_path) -> None:  # noqa: ANN001
    """A mixed fleet's per-replica table named each replica only by its number, to be mapped
    to its group by counting (a tester's finding): each row now starts with its group, model,
    GPU, TP and PP degrees, scheduler and KV capacity, in the file a run writes too."""
    scenario = make_scenario(**{
        "workload.num_requests": 40, "workload.max_tokens": 1024,
        "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"},
        "kv_capacity_tokens": 20_000,
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                         {"count": 2},
                         {"count": 1, "hardware": {"gpu": "h100-80gb", "tensor_parallel": 2},
                          "kv_capacity_tokens": 50_000,
                          "scheduler": {"kind": "paged", "policy": "prefill_first",
                                        "max_num_seqs": 8}},
                         {"count": 1, "scheduler": {"kind": "chunked", "max_num_seqs": 8,
                                                    "enable_prefix_caching": True}},
                     ]}}],
    })
    result = run_scenario(scenario)
    about = result.systems["c"].replicas[["group", "model", "gpu", "tensor_parallel",
                                          "pipeline_parallel", "scheduler", "kv_capacity_tokens"]]
    assert about.values.tolist() == [
        [0, "llama2-7b", "a100-80gb", 1, 1, "paged (mixed)", 20_000],
        [0, "llama2-7b", "a100-80gb", 1, 1, "paged (mixed)", 20_000],
        [1, "llama2-7b", "h100-80gb", 2, 1, "paged (prefill_first)", 50_000],
        [2, "llama2-7b", "a100-80gb", 1, 1, "chunked (prefix caching)", 20_000],
    ]
    write_run(result, tmp_path / "out", plots=False)
    written = pd.read_csv(tmp_path / "out" / "c" / "replicas.csv", index_col="replica")
    assert written["gpu"].tolist() == ["a100-80gb", "a100-80gb", "h100-80gb", "a100-80gb"]
    assert written["group"].tolist() == [0, 0, 1, 2]


def test_replicas_csv_tells_a_data_parallel_attention_replica_from_a_tensor_parallel_one() -> None:
    """A mixture-of-experts group on 2 x 2 H100s (data-parallel attention, experts over all
    four) beside one on two, and a pipelined group: the rows said TP 2, PP 1 for both of the
    first, half the GPUs of the second unsaid (a reviewer's finding)."""
    scenario = make_scenario(**{
        "workload.num_requests": 12, "workload.max_tokens": 1024, "model": "mixtral-8x7b",
        "hardware": {"gpu": "h100-80gb", "tensor_parallel": 2}, "cost": {"kind": "roofline"},
        "kv_capacity_tokens": None,
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 8},
                     "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                         {"count": 1},
                         {"count": 1, "hardware": {"gpu": "h100-80gb", "tensor_parallel": 2,
                                                   "data_parallel_attention": 2,
                                                   "expert_parallel": 4}},
                         {"count": 1, "hardware": {"gpu": "h100-80gb", "tensor_parallel": 2,
                                                   "pipeline_parallel": 2}},
                     ]}}],
    })
    about = run_scenario(scenario).systems["c"].replicas[
        ["tensor_parallel", "pipeline_parallel", "data_parallel_attention", "expert_parallel"]]
    assert about.values.tolist() == [[2, 1, 1, 1], [2, 1, 2, 4], [2, 2, 1, 1]]


def test_given_groups_names_each_group_and_pool_by_its_key() -> None:
    """What refusals and warnings name a group by (`cluster.prefill`, `cluster.replicas[1]`):
    the keys, in the file's order; a count of replicas gives no group (found by mutation:
    'XXdecodeXX' passed every test of the selection)."""
    pools = ClusterConfig.model_validate({"prefill": {"count": 1}, "decode": {"count": 2}})
    assert [(where, g.count) for where, g in pools.given_groups()] == [("prefill", 1), ("decode", 2)]
    groups = ClusterConfig.model_validate({"replicas": [{"count": 1}, {"count": 3}]})
    assert [(where, g.count) for where, g in groups.given_groups()] == [("replicas[0]", 1),
                                                                        ("replicas[1]", 3)]
    assert ClusterConfig.model_validate({"replicas": 3}).given_groups() == []


def test_a_catalog_models_label_names_only_the_changed_keys_of_a_nested_block() -> None:
    """A block the catalog's entry also has (a mixture of experts' `moe`) is compared key by
    key: Mixtral with one expert a token reads as that key alone, not as every key of its
    `moe` block (found by mutation: no label had a changed nested block). A block dropped
    is the block's key alone."""
    mixtral = model_spec("mixtral-8x7b").model_dump()
    one_expert = ModelSpec.model_validate({**mixtral, "moe": {**mixtral["moe"], "experts_per_token": 1}})
    assert model_label(one_expert) == "mixtral-8x7b (moe.experts_per_token=1)"
    assert model_label(ModelSpec.model_validate({**mixtral, "moe": None})) == "mixtral-8x7b (moe=None)"


def test_replicas_csv_tells_groups_apart_by_their_cost_and_inline_model(tmp_path: Path) -> None:
    """Groups that differ only in their cost block (an overhead, an efficiency) read alike,
    an inline model without a name read 'custom' whatever its shape, and a catalog model
    with a field changed read as the catalog's (a tester's note). The `cost` column names the
    kind and the settings given that are not its defaults; the model column adds, in
    brackets, what differs from the catalog's entry of that name, or an unnamed model's
    settings."""
    inline = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "vocab_size": 32000}
    scenario = make_scenario(**{
        "workload.num_requests": 12, "workload.max_tokens": 1024, "model": "llama2-7b",
        "hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"}, "kv_capacity_tokens": 50_000,
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 8},
                     "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                         {"count": 1},
                         {"count": 1, "cost": {"kind": "roofline", "overhead": {}}},
                         {"count": 1, "cost": {"kind": "roofline", "compute_efficiency": 0.5,
                                               "overhead": {"per_iteration_s": 0.004}}},
                         {"count": 1, "model": inline},
                         {"count": 1, "model": {**inline, "name": "tiny"}},
                         {"count": 1, "model": {"catalog": "llama2-7b", "kv_cache_dtype": "fp8"}},
                         {"count": 1, "cost": {"kind": "linear", "base_s": 0.01}},
                     ]}}],
    })
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a linear cost beside a model, an unused capacity
        result = run_scenario(scenario)
    about = result.systems["c"].replicas[["group", "model", "cost"]]
    custom = "custom (num_layers=32, hidden_size=4096, num_heads=32, vocab_size=32000)"
    assert about.values.tolist() == [
        [0, "llama2-7b", "roofline"],
        [1, "llama2-7b", "roofline (overhead)"],
        [2, "llama2-7b", "roofline (compute_efficiency=0.5, overhead.per_iteration_s=0.004)"],
        [3, custom, "roofline"],
        [4, "tiny", "roofline"],
        [5, "llama2-7b (kv_cache_dtype=fp8)", "roofline"],
        [6, "llama2-7b", "linear (base_s=0.01)"],
    ]
    write_run(result, tmp_path / "out", plots=False)
    written = pd.read_csv(tmp_path / "out" / "c" / "replicas.csv", index_col="replica")
    assert written[["model", "cost"]].values.tolist() == about[["model", "cost"]].values.tolist()
    assert list(written.columns[:10]) == ["group", "model", "gpu", "tensor_parallel",
                                          "pipeline_parallel", "data_parallel_attention",
                                          "expert_parallel", "scheduler", "cost",
                                          "kv_capacity_tokens"]


@pytest.mark.parametrize("models", [("llama2-7b", "llama2-13b"), ("llama2-13b", "llama2-7b")])
def test_each_group_of_a_fleet_is_priced_by_its_own_model(models: tuple[str, str]) -> None:
    """Two groups that differ only in their model (the same hardware and cost config): a
    lone request on each takes what a one-replica system of that model takes. (They once
    shared the first group's cost model.)"""
    common = {"workload.num_requests": 2, "workload.prompt_tokens": {"kind": "constant", "value": 512},
              "workload.output_tokens": {"kind": "constant", "value": 8},
              "workload.max_tokens": 1024, "workload.arrival": {"kind": "poisson", "rate_per_s": 0.01},
              "model": models[0], "hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"}}
    scheduler = {"kind": "paged", "max_num_seqs": 8}

    def latency_s(model: str, cluster: dict | None) -> list[float]:
        system = {"name": "c", "scheduler": scheduler} | ({"cluster": cluster} if cluster else {})
        scenario = make_scenario(**{**common, "model": model}, systems=[system])
        reqs = run_scenario(scenario).systems["c"].requests
        return (reqs["finish_s"] - reqs["arrival_s"]).tolist()

    fleet = latency_s(models[0], {"router": {"kind": "round_robin"},
                                  "replicas": [{"count": 1}, {"count": 1, "model": models[1]}]})
    alone = [latency_s(m, None)[0] for m in models]
    assert fleet == pytest.approx(alone, rel=1e-12) and alone[0] != alone[1]


def test_session_affinity_keeps_a_session_on_one_replica() -> None:
    n = 400
    rng = np.random.default_rng(0)
    requests = Requests(np.sort(rng.uniform(0, 40, n)), rng.integers(8, 64, n),
                        rng.integers(1, 32, n), np.full(n, 96), session_ids=rng.integers(0, 25, n))
    scenario = make_scenario(**{
        "workload.num_requests": n,
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"replicas": 4, "router": {"kind": "session"}}}],
    })
    fleet = build_fleet(scenario, scenario.systems[0], requests)
    fleet.run()
    homes = {}
    for session, replica in zip(requests.session_ids.tolist(), fleet.assigned.tolist(), strict=True):
        assert homes.setdefault(session, replica) == replica
    assert len(set(homes.values())) == 4  # sessions spread over the fleet


@pytest.mark.parametrize("fallback", ["round_robin", "least_outstanding", "least_kv"])
def test_a_session_router_without_sessions_routes_as_its_fallback(fallback: str) -> None:
    # Every request is its own session: the same replicas as the fallback alone (round
    # robin once sent all of them to replica 0, its turn never moving).
    def assigned(router: dict) -> list[int]:
        scenario = make_scenario(**{
            "workload.num_requests": 120,
            "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 8},
                         "cluster": {"replicas": 3, "router": router}}],
        })
        return run_scenario(scenario).systems["c"].requests["replica"].tolist()

    session = assigned({"kind": "session", "fallback": fallback})
    assert session == assigned({"kind": fallback})
    assert sorted(set(session)) == [0, 1, 2]


@pytest.mark.parametrize(("change", "needle"), [
    ({"router": {"kind": "nearest"}}, "router"),
    ({"replicas": 0}, "replicas"),
    ({"replicas": [{"count": 0}]}, "count"),
    ({"replicas": []}, "replicas = []"),
    ({"replicas": 10**12}, "expected at most 10,000"),
    ({"replicas": [{"count": 6000}, {"count": 6000}]}, "12,000 replicas"),
    ({"prefill": {"count": 10**12}, "decode": {"count": 1}}, "expected at most"),
    ({"replicas": [{"count": 1}, {"count": 1, "kv_capacity_tokens": 64}]},
     "replicas[1].kv_capacity_tokens = 64 is below workload.max_tokens = 96"),
    ({"replicas": [{"count": 2, "router": {"kind": "random"}}]},
     "replicas[0]: unknown key 'router' here: expected it in the system's cluster block (cluster.router)"),
    ({"prefill": {"count": 1}, "decode": {"replicas": 2}},
     "decode: unknown key 'replicas' here: a pool's instances are its 'count'"),
    ({"router": {"kind": "session", "fallback": "session"}}, "fallback"),
    ({"router": {"kind": "prefix_affinity", "balance_rel_threshold": 0.5}}, "balance_rel_threshold"),
    ({"router": {"kind": "prefix_affinity", "cache_threshold": 2}}, "cache_threshold"),
])
def test_bad_cluster_keys_are_one_line_errors(change: dict, needle: str) -> None:
    data = {**BASE, "systems": [{"name": "c", "scheduler": {"kind": "iteration_level",
                                                             "max_batch_size": 4},
                                 "cluster": change}]}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    message = str(err.value)
    assert "\n" not in message and needle in message, message


def test_a_cluster_run_writes_its_replicas(tmp_path) -> None:  # noqa: ANN001 - a pytest path
    from orcasim.results import write_run

    scenario = make_scenario(**{
        "workload.num_requests": 200,
        "systems": [
            {"name": "fleet", "scheduler": {"kind": "paged", "max_num_seqs": 8},
             "cluster": {"replicas": 2, "router": {"kind": "least_tokens"}}},
            {"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 8},
             "cluster": {"prefill": {"count": 1}, "decode": {"count": 2}}},
        ],
    })
    out = write_run(run_scenario(scenario), tmp_path / "run")
    import pandas as pd

    fleet = pd.read_csv(out / "fleet" / "replicas.csv", index_col=0)
    assert list(fleet.index) == [0, 1] and fleet["requests_routed"].sum() == 200
    pools = pd.read_csv(out / "pd" / "replicas.csv")
    assert pools[["pool", "replica"]].values.tolist() == [["prefill", 0], ["decode", 0], ["decode", 1]]
    assert (out / "replicas_fleet.png").is_file() and (out / "replicas_pd.png").is_file()
    requests = pd.read_parquet(out / "pd" / "requests.parquet")
    assert {"prefill_replica", "decode_replica", "kv_transfer_s", "decode_wait_s"} <= set(requests)


def _fleet_run(seed: int = 0, **changes: object) -> SystemResult:
    scenario = make_scenario(**{
        "seed": seed, "workload.num_requests": 60,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 4.0},
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"replicas": 3, "router": {"kind": "random"}}}],
        **changes,
    })
    return run_scenario(scenario).systems["c"]


def test_random_routing_follows_the_scenario_s_seed() -> None:
    runs = [_fleet_run(seed=7) for _ in range(2)]
    same = [run.requests["replica"].tolist() for run in runs]
    assert same[0] == same[1] and sorted(set(same[0])) == [0, 1, 2]
    rows = runs[0].iterations  # one frame over the replicas' rows
    assert rows.index.tolist() == list(range(len(rows))) and rows["replica"].nunique() == 3
    assert _fleet_run(seed=8).requests["replica"].tolist() != same[0]


@pytest.mark.filterwarnings("ignore:.*can never fit")
def test_a_fleet_turns_away_a_request_no_replica_can_hold(tmp_path) -> None:  # noqa: ANN001
    # Request 1's prompt alone is larger than every replica's pool.
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,32,4\n0.5,300,4\n1.0,32,4\n")
    scenario = make_scenario(**{
        "workload.num_requests": 3, "kv_capacity_tokens": 256, "workload.max_tokens": 512,
        "workload.arrival": {"kind": "trace", "path": str(trace)},
        "workload.prompt_tokens": None, "workload.output_tokens": None,
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"replicas": 2, "router": {"kind": "round_robin"}}}],
    })
    result = run_scenario(scenario).systems["c"]
    reqs = result.requests
    assert reqs["rejected"].tolist() == [False, True, False]
    assert reqs["finish_s"].notna().tolist() == [True, False, True]
    assert reqs["replica"].tolist() == [0, 1, 0]
    assert result.iterations.index.tolist() == list(range(len(result.iterations)))


def test_a_cluster_without_a_replica_count_is_one_replica() -> None:
    result = _fleet_run(**{"systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                                        "cluster": {"router": {"kind": "least_kv"}}}]})
    assert result.requests["replica"].eq(0).all() and result.summary["replicas"] == 1.0


def test_a_cluster_of_pipelined_replicas_times_requests_as_one_pipelined_server() -> None:
    """Orca pipelined over two stages, as a one-replica cluster and as a plain system: the
    same per-request times (the cluster builds the pipelined stepper too)."""
    scheduler = {"kind": "iteration_level", "max_batch_size": 4}
    scenario = make_scenario(**{
        "workload.num_requests": 40, "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
        "cost": {"kind": "linear", "base_s": 0.02, "per_token_s": 1e-5},
        "systems": [{"name": "plain", "scheduler": scheduler},
                    {"name": "fleet", "scheduler": scheduler, "cluster": {"replicas": 1}},
                    {"name": "unpipelined", "scheduler": scheduler,
                     "cluster": {"replicas": [{"count": 1, "hardware": {"gpu": "a100-40gb"}}]}}],
    })
    systems = run_scenario(scenario).systems
    plain, fleet = systems["plain"].requests, systems["fleet"].requests
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        assert np.array_equal(plain[column], fleet[column]), column
    assert not np.array_equal(plain["finish_s"], systems["unpipelined"].requests["finish_s"])


def test_each_pipelined_replica_reports_as_itself() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 20, "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                     "cluster": {"replicas": 2, "router": {"kind": "round_robin"}}}],
    })
    result = run_scenario(scenario).systems["c"]
    assert result.requests["replica"].tolist() == [0, 1] * 10
    assert sorted(set(result.iterations["replica"])) == [0, 1]


@pytest.mark.parametrize(("where", "cluster"), [
    ("cluster.replicas[1].hardware", {"replicas": [
        {"count": 1}, {"count": 1, "hardware": {"gpu": "h100-80gb", "tensor_parallel": 4}}]}),
    ("cluster.replicas[0].model", {"replicas": [{"count": 1, "model": "llama2-13b"}]}),
    ("cluster.prefill.hardware", {"prefill": {"count": 1, "hardware": {"gpu": "a100-80gb", "tensor_parallel": 2}},
                                  "decode": {"count": 1}}),
])
def test_a_group_s_own_deployment_under_a_linear_cost_is_warned_of(where: str, cluster: dict) -> None:
    """A linear cost reads no hardware or model: a group on 4 H100s inheriting the scenario's
    (written for one A100) ran at its prices, TPOT 10.45 ms against the A100's 10.34, and
    only its KV capacity was the H100s' (a tester's finding). The group's own cost is silent."""
    cluster = copy.deepcopy(cluster)  # the group's cost is added below: not to the parameter's
    changes = {"workload.num_requests": 10, "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"},
               "kv_capacity_tokens": None}
    system = {"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 4}, "cluster": cluster}
    with pytest.warns(UserWarning, match=rf"systems\[0\]\.{re.escape(where)}.*cost.kind = 'linear'"):
        make_scenario(**changes, systems=[system])
    group = cluster.get("replicas", [cluster.get("prefill")])[-1]
    group["cost"] = {"kind": "linear", "base_s": 0.005}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_scenario(**changes, systems=[system])


def test_a_group_that_changes_only_its_memory_share_is_not_warned_of() -> None:
    """A group on the scenario's GPUs at its parallelism with only `gpu_memory_utilization`
    (or `activation_reserve_gib`) of its own changes its KV capacity alone, which the
    inherited linear cost rightly does not price: it was told to expect a cost of its own."""
    changes = {"workload.num_requests": 10, "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"},
               "kv_capacity_tokens": None}
    for own in ({"gpu_memory_utilization": 0.5}, {"activation_reserve_gib": 4.0}):
        system = {"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 4}, "cluster": {
            "replicas": [{"count": 1}, {"count": 1, "hardware": {"gpu": "a100-80gb", **own}}]}}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            make_scenario(**changes, systems=[system])
    system["cluster"]["replicas"][1]["hardware"]["tensor_parallel"] = 2  # another deployment
    with pytest.warns(UserWarning, match=r"replicas\[1\]\.hardware.*cost.kind = 'linear'"):
        make_scenario(**changes, systems=[system])


def test_the_warning_of_an_inherited_linear_cost_says_what_its_overhead_reads() -> None:
    """A linear cost with an overhead: the overhead reads the group's own hardware (its TP
    round trip, 69dfc67), so the group's tensor_parallel 4 does change its speed (a lone
    request's iteration 0.010852 -> 0.017852 s). The warning said 'not its speed'."""
    group = {"count": 1, "kv_capacity_tokens": 1_000,
             "hardware": {"gpu": "a100-80gb", "tensor_parallel": 4}}
    data = {"name": "overhead-group", "kv_capacity_tokens": 1_000,
            "workload": {"num_requests": 1, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                         "prompt_tokens": {"kind": "constant", "value": 8},
                         "output_tokens": {"kind": "constant", "value": 1}, "max_tokens": 64},
            "cost": {"kind": "linear", "base_s": 0.010, "overhead": {}},
            "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                         "cluster": {"replicas": [group]}}]}
    with pytest.warns(UserWarning, match=r"cluster\.replicas\[0\]\.hardware.*its overhead's "
                      r"launches and process count\), not its GPU time") as said:
        sc = scenario_from_dict(data, "overhead-group")
    assert not any("not its speed" in str(w.message) for w in said)
    req = run_scenario(sc).systems["c"].requests.iloc[0]
    assert req["e2e_s"] == pytest.approx(0.010 + 0.81e-3 + 0.042e-3 + 7e-3, rel=1e-12)


def test_the_warning_of_an_inherited_linear_cost_says_what_orca_s_pipeline_reads() -> None:
    """A group of its own hardware on 2 pipeline stages under the scenario's linear cost
    (iterations of 1 s): Orca keeps 2 batches in flight, each stage half an iteration, so
    two lone requests of 2 tokens out finish at 2.0 and 2.5 s, not 2.0 and 4.0 as on the
    scenario's one stage. The warning said its hardware changed only its KV capacity."""
    group = {"count": 1, "kv_capacity_tokens": 1_000,
             "hardware": {"gpu": "a100-80gb", "pipeline_parallel": 2}}
    data = {"name": "pp-group", "kv_capacity_tokens": 1_000, "hardware": {"gpu": "a100-80gb"},
            "workload": {"num_requests": 2, "arrival": {"kind": "constant", "rate_per_s": 1e9},
                         "prompt_tokens": {"kind": "constant", "value": 8},
                         "output_tokens": {"kind": "constant", "value": 2}, "max_tokens": 64},
            "cost": {"kind": "linear", "base_s": 1.0},
            "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 1},
                         "cluster": {"replicas": [group]}}]}
    with pytest.warns(UserWarning, match=r"cluster\.replicas\[0\]\.hardware.*\(and any KV "
                      r"transfer, and the 2 batches Orca keeps in flight on its "
                      r"pipeline_parallel = 2\), not its GPU time"):
        sc = scenario_from_dict(data, "pp-group")
    finish_s = run_scenario(sc).systems["c"].requests["finish_s"] - 1e-9 * np.arange(2)
    assert finish_s.tolist() == pytest.approx([2.0, 2.5], abs=1e-8)
    group["hardware"] = {"gpu": "a100-80gb", "tensor_parallel": 2}  # the scenario's stages
    with pytest.warns(UserWarning, match=r"\(and any KV transfer\), not its GPU time"):
        scenario_from_dict(data, "pp-group")


def test_a_group_s_cost_model_is_its_own_after_an_earlier_group_s_spec_is_gone() -> None:
    """Cost models were kept by the id of each group's spec; a spec no longer referenced
    (an earlier group's, once the loop moved on) may give its id to a later one, which then
    got the earlier group's model: base_s 0.05 priced at 0.01 (a tester's finding, here
    with the freed spec's memory taken at once, as CPython's allocator does)."""
    scheduler = PagedConfig(kind="paged")
    built: BuiltCosts = {}

    def spec(base_s: float) -> list[ReplicaSpec]:
        return [ReplicaSpec(scheduler, LinearCostConfig(kind="linear", base_s=base_s), 1000, None, None)]

    first = cost_models(spec(0.01), built)[0]
    second = cost_models(spec(0.05), built)[0]
    assert isinstance(first, LinearCost) and isinstance(second, LinearCost)
    assert (first.base_s, second.base_s) == (0.01, 0.05)
    assert built_models(built) == [first, second]


def test_a_cluster_warns_of_an_unpipelined_scheduler_on_pipeline_stages() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 10, "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 4},
                     "cluster": {"replicas": 2}}],
    })
    with pytest.warns(UserWarning, match="'paged' with hardware.pipeline_parallel = 2"):
        run_scenario(scenario)


def test_a_cluster_s_replicas_size_their_swap_space_from_the_model() -> None:
    """Swapping needs a token's KV bytes, which a replica takes from its deployment: a
    one-replica cluster of swapping paged replicas preempts and swaps exactly as the
    plain system does (and does not fail for want of the bytes)."""
    scheduler = {"kind": "paged", "max_num_seqs": 32, "preemption": "swap",
                 "swap_space_bytes": 2**30}
    scenario = make_scenario(**{
        "workload.num_requests": 60, "workload.arrival": {"kind": "poisson", "rate_per_s": 50.0},
        "workload.output_tokens": {"kind": "uniform", "low": 100, "high": 200},
        "workload.max_tokens": 300, "model": "opt-13b", "hardware": {"gpu": "a100-80gb"},
        "kv_capacity_tokens": 2000, "cost": {"kind": "linear", "base_s": 0.01},
        "systems": [{"name": "plain", "scheduler": scheduler},
                    {"name": "fleet", "scheduler": scheduler, "cluster": {"replicas": 1}}],
    })
    systems = run_scenario(scenario).systems
    plain, fleet = systems["plain"], systems["fleet"]
    assert plain.requests["preemptions"].sum() > 0
    for column in ("finish_s", "preemptions"):
        assert np.array_equal(plain.requests[column], fleet.requests[column]), column
    assert fleet.iterations["recomputed_tokens"].sum() == 0  # swapped, not recomputed
    assert fleet.iterations["duration_s"].sum() == plain.iterations["duration_s"].sum()


def test_each_replica_takes_its_group_s_keys_then_the_system_s_then_the_scenario_s() -> None:
    """pool_specs by hand: a group's scheduler, cost, model, hardware and KV pool override
    the system's and the scenario's; a group with its own model or hardware derives its own
    KV pool from them (unless it names one); a plain group keeps the scenario's."""
    from orcasim.cost.catalog import Deployment
    from orcasim.fleet import replica_specs

    base_hw = {"gpu": "a100-80gb"}
    system_scheduler = {"kind": "paged", "max_num_seqs": 8}
    scenario = make_scenario(**{
        "model": "llama2-7b", "hardware": base_hw, "kv_capacity_tokens": 5000,
        "cost": {"kind": "roofline"},
        "systems": [{"name": "c", "scheduler": system_scheduler,
                     "cost": {"kind": "linear", "base_s": 0.5},
                     "cluster": {"replicas": [
                         {"count": 2},
                         {"count": 1, "model": "llama2-13b"},
                         {"count": 1, "hardware": {"gpu": "a100-80gb", "tensor_parallel": 2}},
                         {"count": 1, "model": "llama2-13b", "kv_capacity_tokens": 700,
                          "scheduler": {"kind": "iteration_level", "max_batch_size": 2},
                          "cost": {"kind": "linear", "base_s": 2.0}},
                     ]}}],
    })
    specs = replica_specs(scenario, scenario.systems[0])
    assert len(specs) == 5 and specs[0] is specs[1]  # a group's copies share one spec
    plain, bigger, wider, own = specs[1:]
    assert plain.model.name == "llama2-7b" and plain.kv_capacity_tokens == 5000
    assert plain.scheduler.kind == "paged" and plain.cost.base_s == 0.5  # the system's cost
    derived = Deployment(model=bigger.model, hardware=bigger.hardware).kv_capacity_tokens
    assert bigger.model.name == "llama2-13b" and bigger.kv_capacity_tokens == derived != 5000
    assert wider.hardware.tensor_parallel == 2 and wider.model.name == "llama2-7b"
    assert wider.kv_capacity_tokens == Deployment(model=wider.model,
                                                  hardware=wider.hardware).kv_capacity_tokens
    assert own.kv_capacity_tokens == 700 and own.scheduler.kind == "iteration_level"
    assert own.cost.base_s == 2.0 and own.hardware == plain.hardware
    assert plain.deployment() == Deployment(model=plain.model, hardware=plain.hardware)
    # Without a model or without hardware there is no deployment to price.
    bare = make_scenario(**{"systems": [{"name": "c", "scheduler": system_scheduler,
                                         "cluster": {"replicas": 2}}]})
    assert [spec.deployment() for spec in replica_specs(bare, bare.systems[0])] == [None, None]
    half = make_scenario(**{"model": "llama2-7b", "systems": bare.model_dump()["systems"]})
    assert replica_specs(half, half.systems[0])[0].deployment() is None


def test_a_fleet_run_ends_at_its_last_finish_though_a_replica_stayed_idle() -> None:
    # Two requests on three replicas: the third never works, and does not move the end.
    requests = Requests(np.array([0.0, 0.1]), np.array([8, 8]), np.array([2, 3]), np.full(2, 96))
    scenario = make_scenario(**{
        "workload.num_requests": 2, "cost": {"kind": "linear", "base_s": 0.125},
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"replicas": 3, "router": {"kind": "round_robin"}}}],
    })
    run = build_fleet(scenario, scenario.systems[0], requests).run()
    assert run.recorder.finish_s.tolist() == [0.25, 0.475]
    assert run.end_s == 0.475


def test_a_router_reads_the_load_of_pipelined_replicas() -> None:
    """least_tokens over two pipelined Orca replicas: the router asks each for its load at
    every arrival; both are used, and the result does not depend on the engine's mode."""
    frames = requests_in_both_modes("c", **{
        "workload.num_requests": 30, "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                     "cluster": {"replicas": 2, "router": {"kind": "least_tokens"}}}],
    })
    assert sorted(set(frames["fast"]["replica"])) == [0, 1]
    assert frames["fast"]["finish_s"].notna().all()
    for column in ("replica", "first_token_s", "finish_s"):
        assert frames["fast"][column].equals(frames["reference"][column]), column


def _oversized_fleet_frames(seed: int, num_requests: int, rate_per_s: float, kv_tokens: int,
                           scheduler: dict, router: str, num_replicas: int) -> dict[str, pd.DataFrame]:
    """A fleet in both modes whose prompts go up to 0.9 of a replica's pool and outputs up to
    0.29 of it (300 tokens of 1,024): about one request in ten can never fit."""
    return requests_in_both_modes("c", seed=seed, **{
        "workload.num_requests": num_requests,
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
        "workload.prompt_tokens": {"kind": "uniform", "low": 1, "high": int(0.9 * kv_tokens)},
        "workload.output_tokens": {"kind": "uniform", "low": 1, "high": kv_tokens * 300 // 1024},
        "workload.max_tokens": kv_tokens * 2000 // 1024, "kv_capacity_tokens": kv_tokens,
        "systems": [{"name": "c", "scheduler": {**scheduler, "block_size_tokens": 16},
                     "cluster": {"replicas": num_replicas, "router": {"kind": router}}}]})


@pytest.mark.parametrize(("router", "seed"), [("least_outstanding", 2), ("power_of_two", 7)])
def test_a_counting_router_sees_a_turned_away_request_leave_at_its_boundary(
    router: str, seed: int
) -> None:
    """`least_outstanding` and `power_of_two` count each replica's requests, its inbox
    included, without applying a pending jump. A request that can never fit is turned away
    at the first boundary after its arrival; the reference loop's count drops there. A jump
    whose FCFS head is blocked used to go on past that boundary (a later arrival cannot
    join), so fast mode counted the turned-away request until the jump ended, and routed
    the next request elsewhere. Fast mode must route as reference does."""
    frames = _oversized_fleet_frames(seed, 120, 15.0, 1024, {
        "kind": "paged", "max_num_seqs": 16, "max_num_batched_tokens": 2048}, router, 2)
    fast, reference = frames["fast"], frames["reference"]
    assert reference["first_scheduled_s"].isna().sum() >= 3  # turned away
    pd.testing.assert_frame_equal(fast, reference, check_exact=True)


@settings(max_examples=examples(20), deadline=None)
@given(
    router=st.sampled_from([r for r in ROUTERS if r != "session"]),
    num_replicas=st.integers(2, 3),
    scheduler=st.sampled_from(["mixed", "prefill_first", "chunked"]),
    rate_per_s=st.sampled_from([5.0, 15.0, 40.0]),
    seed=st.integers(0, 2**16),
)
def test_a_fleet_with_requests_that_never_fit_routes_as_reference_mode_does(
    router: str, num_replicas: int, scheduler: str, rate_per_s: float, seed: int
) -> None:
    """Fast mode is exact behind every router, while requests that can never fit are turned
    away at replicas whose jumps are under way (the case of the test above, at random)."""
    keys = {"mixed": {"kind": "paged", "max_num_seqs": 16, "max_num_batched_tokens": 2048},
            "prefill_first": {"kind": "paged", "policy": "prefill_first", "max_num_seqs": 8,
                              "max_num_batched_tokens": 2048},
            "chunked": {"kind": "chunked", "chunk_size_tokens": 256, "max_num_seqs": 8}}[scheduler]
    frames = _oversized_fleet_frames(seed, 80, rate_per_s, 512, keys, router, num_replicas)
    pd.testing.assert_frame_equal(frames["fast"], frames["reference"], check_exact=True)


@pytest.mark.parametrize("scheduler", [{"kind": "iteration_level", "max_batch_size": 8},
                                       {"kind": "paged", "max_num_seqs": 8},
                                       {"kind": "chunked", "chunk_size_tokens": 16}])
@pytest.mark.parametrize("router", ["least_tokens", "least_kv"])
@pytest.mark.parametrize("seed", [0, 2, 3])
def test_a_router_s_look_at_a_shared_boundary_sees_what_reference_mode_sees(
        scheduler: dict, router: str, seed: int) -> None:
    """Iterations of 10 ms on three replicas end together, and a closed loop's clients
    (no think time) send again at a completion's time. Reference mode takes the replicas'
    ENDs at that time in index order, so a request sent by replica 1's completion sees
    replica 0's iteration there ended (and not yet replanned) and replica 2's not; fast
    mode, with that end inside a pending jump, must see the same (it applied none of them:
    8 of these 18 cases routed differently)."""
    frames = requests_in_both_modes("c", **{
        "seed": seed, "workload.num_requests": 40,
        "workload.arrival": {"kind": "closed_loop", "num_clients": 5,
                             "think_time": {"kind": "constant", "value_s": 0.0}},
        "workload.prompt_tokens": {"kind": "uniform", "low": 1, "high": 20},
        "workload.output_tokens": {"kind": "uniform", "low": 1, "high": 20},
        "workload.max_tokens": 64, "kv_capacity_tokens": 4096,
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0},
        "systems": [{"name": "c", "scheduler": scheduler,
                     "cluster": {"replicas": 3, "router": {"kind": router}}}],
    })
    for column in ("replica", "arrival_s", "first_token_s", "finish_s"):
        assert np.array_equal(frames["fast"][column], frames["reference"][column],
                              equal_nan=True), column


@pytest.mark.parametrize(("router", "phrase"), [
    ({"kind": "session"}, "system c: cluster.router session: the workload has no sessions"),
    ({"kind": "prefix_affinity"}, "system c: cluster.router prefix_affinity: no replica keeps a prefix cache"),
])
def test_a_router_that_cannot_do_its_job_says_so(router: dict, phrase: str) -> None:
    """A session router without sessions, or prefix affinity without caches, routed by its
    fallback without a word."""
    systems = [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                "cluster": {"replicas": 2, "router": router}}]
    with pytest.warns(UserWarning, match=phrase):
        _fleet_run(systems=systems)


def test_a_link_on_a_colocated_cluster_says_it_is_not_used() -> None:
    """`link` is read only between prefill and decode pools; a colocated fleet ran without it
    and without a word. The default link says nothing (saved scenarios write it out)."""
    systems = [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                "cluster": {"replicas": 2, "link": {"kind": "ethernet"}}}]
    message = ("system c: cluster.link is not used: a colocated cluster moves no KV between "
               "instances (a disaggregated one, with prefill and decode pools, does)")
    with pytest.warns(UserWarning, match=f"^{re.escape(message)}$"):
        _fleet_run(systems=systems)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fleet_run(systems=[{**systems[0], "cluster": {"replicas": 2, "link": {"kind": "nvlink"}}}])


ORCA_MAX = {"kind": "iteration_level", "max_batch_size": 4, "kv_reservation": "max"}


def _reserving(cluster: dict, scheduler: dict, **top: object) -> dict:
    return {**BASE, **top, "systems": [{"name": "c", "scheduler": scheduler, "cluster": cluster}]}


@pytest.mark.parametrize(("cluster", "needle"), [
    # A decode pool with Orca's max reservation of its own, on the scenario's 2000 tokens.
    ({"prefill": {"count": 1}, "decode": {"count": 1, "scheduler": ORCA_MAX}},
     "workload.max_tokens = 2048 exceeds kv_capacity_tokens = 2000: c (cluster.decode) reserve"),
    ({"replicas": [{"count": 1, "kv_capacity_tokens": 4096},
                   {"count": 1, "scheduler": ORCA_MAX}]},
     "c (cluster.replicas[1]) reserve max_tokens per request"),
    # A group whose own hardware leaves 1,545 tokens of KV (OPT-13B at 33% of an A100-80GB).
    ({"replicas": [{"count": 1, "scheduler": ORCA_MAX,
                    "hardware": {"gpu": "a100-80gb", "gpu_memory_utilization": 0.33}}]},
     "systems[0].cluster.replicas[0]: its KV capacity, 1545 tokens as its own model and hardware "
     "leave it, is below workload.max_tokens = 2048"),
])
def test_a_group_or_pool_that_could_admit_nothing_is_refused_whatever_its_kv_source(
        cluster: dict, needle: str) -> None:
    """Only a group's own kv_capacity_tokens was checked: one inheriting the scenario's KV, or
    deriving its own from its hardware, passed `validate` and rejected every request."""
    data = _reserving(cluster, {"kind": "paged", "max_num_seqs": 8}, model="opt-13b",
                      hardware={"gpu": "a100-80gb"}, kv_capacity_tokens=2000)
    data["workload"] = {**BASE["workload"], "max_tokens": 2048}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert needle in str(err.value), err.value


def test_a_reserving_system_scheduler_no_replica_runs_is_not_refused() -> None:
    """Every group gives its own paged scheduler: the system's request-level one, which would
    admit nothing on 2000 tokens, runs nowhere (it was refused all the same)."""
    paged = {"kind": "paged", "max_num_seqs": 8}
    data = _reserving({"replicas": [{"count": 2, "scheduler": paged}]},
                      {"kind": "request_level", "max_batch_size": 4})
    data["workload"] = {**BASE["workload"], "num_requests": 40, "max_tokens": 4096}
    reqs = run_scenario(scenario_from_dict(data)).systems["c"].requests
    assert not reqs["rejected"].any() and reqs["finish_s"].notna().all()


def test_a_replicas_busy_share_is_of_the_systems_measured_window() -> None:
    """Arrivals at 10 to 50 s, each served for 10 s: busy throughout the 50 s the summary
    measures, the replica read 0.83, its time counted from 0 (a tester's finding)."""
    data = {"name": "t", "seed": 1, "kv_capacity_tokens": 1000,
            "workload": {"num_requests": 5, "arrival": {"kind": "constant", "rate_per_s": 0.1},
                         "prompt_tokens": {"kind": "constant", "value": 10},
                         "output_tokens": {"kind": "constant", "value": 10}, "max_tokens": 20},
            "cost": {"kind": "linear", "base_s": 1.0},
            "systems": [{"name": "s", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                         "cluster": {"replicas": 1}}]}
    result = run_scenario(scenario_from_dict(data)).systems["s"]
    assert result.summary["duration_s"] == 50.0
    assert result.replicas["busy_fraction"].tolist() == [1.0]


def _trace_scenario(tmp_path, rows: str, cluster: dict, warmup_s: float = 0.0) -> dict:  # noqa: ANN001
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return {"name": "w", "seed": 1, "warmup_s": warmup_s, "kv_capacity_tokens": 20000,
            "workload": {"arrival": {"kind": "trace", "path": str(tmp_path / "t.csv")}, "max_tokens": 400},
            "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 2e-5, "per_context_token_s": 1e-7},
            "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8}, "cluster": cluster}]}


@pytest.mark.parametrize("cluster", [{"replicas": 1}, {"prefill": {"count": 1}, "decode": {"count": 1}}])
def test_a_busy_share_stays_within_one_past_the_warm_up(tmp_path, cluster: dict) -> None:  # noqa: ANN001
    """A request arriving just before the warm-up's end decodes 200 tokens after the last
    measured one finished: its iterations counted over the measured requests' window read
    busy shares of 12 (a tester's finding against this session's window)."""
    data = _trace_scenario(tmp_path, "0.0,100,5\n0.9,100,200\n1.1,100,5\n", cluster, warmup_s=1.0)
    result = run_scenario(scenario_from_dict(data)).systems["c"]
    assert ((result.replicas["busy_fraction"] > 0) & (result.replicas["busy_fraction"] <= 1)).all()
    assert result.replicas["busy_fraction"].max() > 0.9  # busy throughout, as it was


def test_replicas_throughputs_add_up_to_the_clusters(tmp_path) -> None:  # noqa: ANN001
    """Each replica's throughput was over its own window: one that served two requests in
    its first half second of the cluster's 10.5 read 1.99 req/s, the two summing to 7.6
    times the cluster's (a tester's finding). Over the system's window they add up."""
    data = _trace_scenario(tmp_path, "0.0,100,50\n0.1,100,50\n10.0,100,50\n",
                           {"replicas": 2, "router": {"kind": "round_robin"}})
    result = run_scenario(scenario_from_dict(data)).systems["c"]
    assert result.replicas["throughput_rps"].sum() == pytest.approx(result.summary["throughput_rps"],
                                                                    rel=1e-12)
    assert (result.replicas["duration_s"] == result.summary["duration_s"]).all()


def test_a_groups_deployment_that_leaves_no_kv_names_the_group() -> None:
    """A llama2-70b group on the scenario's one A100: the refusal named the scenario's
    hardware.tensor_parallel, which is right for its llama2-7b (a tester's finding). The
    group runs on the scenario's hardware, so the key is named as the file gives it, under
    the group ('replicas[1].hardware.tensor_parallel' named a key the file lacks)."""
    data = {"name": "g", "seed": 1, "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"},
            "cost": {"kind": "roofline"},
            "workload": {"num_requests": 20, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                         "prompt_tokens": {"kind": "constant", "value": 16},
                         "output_tokens": {"kind": "constant", "value": 4}, "max_tokens": 400},
            "systems": [{"name": "m", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                         "cluster": {"replicas": [{"count": 1}, {"count": 1, "model": "llama2-70b"}]}}]}
    with pytest.raises(ScenarioError, match=r"systems\[0\].cluster.replicas\[1\]: hardware.tensor_"
                                            r"parallel = 1 \(pipeline_parallel 1\): model llama2-70b"):
        scenario_from_dict(data)


def test_a_follow_up_sent_at_a_boundary_a_replica_planned_waits_for_its_next_one() -> None:
    """A closed loop's request turned away at replica 4's PLAN at 0.19 s sends its follow-up
    there, at 0.19 s, and round robin hands it to replica 2, whose PLAN at 0.19 s the
    reference loop took before replica 4's: it waits for 0.20 s. Fast mode, mid-jump, cut
    the jump at 0.19 s and admitted it one iteration early (a tester's finding; 11 of 1,500
    random closed loops and conversations differed)."""
    import copy

    from orcasim.run import run_scenario

    data = {"name": "b", "seed": 233,
            "workload": {"num_requests": 13, "max_tokens": 100,
                         "arrival": {"kind": "closed_loop", "num_clients": 2,
                                     "think_time": {"kind": "constant", "value_s": 0.0}},
                         "prompt_tokens": {"kind": "uniform", "low": 1, "high": 60},
                         "output_tokens": {"kind": "uniform", "low": 1, "high": 30}},
            "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0},
            "kv_capacity_tokens": 40,
            "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 3, "block_size_tokens": 4},
                         "cluster": {"replicas": 5, "router": {"kind": "round_robin"}}}]}
    frames = {}
    for mode in ("fast", "reference"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # requests that never fit
            frames[mode] = run_scenario({**copy.deepcopy(data), "engine": {"mode": mode}}).systems["c"].requests
    columns = ["arrival_s", "first_scheduled_s", "finish_s", "replica"]
    pd.testing.assert_frame_equal(frames["fast"][columns], frames["reference"][columns])
    assert frames["reference"]["first_scheduled_s"][8] == pytest.approx(0.20)


def test_requests_too_large_for_the_replica_they_were_sent_to_are_said_by_replica(tmp_path) -> None:  # noqa: ANN001
    """Behind a router a request is turned away by the replica it was sent to, which another
    may have held: the warning said only 'can never fit in KV memory' (a tester's finding)."""
    f = tmp_path / "mixed.yaml"
    f.write_text(
        "name: mixed\nseed: 3\nworkload:\n  num_requests: 60\n  arrival: {kind: poisson, rate_per_s: 5.0}\n"
        "  prompt_tokens: {kind: uniform, low: 8, high: 400}\n  output_tokens: {kind: uniform, low: 1, high: 100}\n"
        "  max_tokens: 600\ncost: {kind: linear, base_s: 0.01, per_token_s: 1.0e-4}\nkv_capacity_tokens: 4096\n"
        "systems:\n  - name: rr\n    scheduler: {kind: paged, max_num_seqs: 8}\n    cluster:\n"
        "      router: {kind: round_robin}\n"
        "      replicas: [{count: 1, kv_capacity_tokens: 256}, {count: 1}]\n")
    from orcasim.run import run_scenario

    with pytest.warns(UserWarning, match=r"rr: (\d+) request\(s\) can never fit in the KV memory of "
                                         r"the replica the router sent them to \(replica 0: \1\)"):
        result = run_scenario(f)
    assert (result.systems["rr"].requests.query("rejected")["replica"] == 0).all()


def test_a_replica_groups_own_pipeline_is_named_as_the_groups(tmp_path) -> None:  # noqa: ANN001
    """The unpipelined-scheduler warning named `hardware.pipeline_parallel = 2` where the
    scenario's hardware has none and a replica group gave its own (a tester's finding): it
    now names the group's key."""
    import subprocess
    import sys

    import yaml

    data = {
        "name": "pp", "seed": 1, "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"},
        "workload": {"num_requests": 10, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
                     "prompt_tokens": {"kind": "uniform", "low": 32, "high": 512},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 32}, "max_tokens": 640},
        "cost": {"kind": "roofline"},
        "systems": [{"name": "fleet", "scheduler": {"kind": "paged"},
                     "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                         {"count": 1, "hardware": {"gpu": "a100-80gb", "pipeline_parallel": 2}},
                         {"count": 1}]}}]}
    path = tmp_path / "pp.yaml"
    path.write_text(yaml.safe_dump(data))
    done = subprocess.run([sys.executable, "-m", "orcasim", "run", str(path), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("warning: systems[0].cluster.replicas[0].hardware.pipeline_parallel = 2 with a "
            "'paged' scheduler") in done.stderr, done.stderr


def test_one_saturated_replica_flags_the_fleet() -> None:
    """Round robin over 7 replicas and one 3.6 times slower: the slow one gets 3.5 req/s of
    2.43 it can serve, and its queue grows without bound, while the fleet's pooled queue,
    read in units of all arrivals, grew too little to flag (z 1.5). The fleet read
    `saturated` 0 with no warning (a tester's finding)."""
    slow = {"kind": "linear", "base_s": 0.04, "per_token_s": 1e-4, "per_context_token_s": 0.0}
    scenario = make_scenario(**{
        "workload.num_requests": 2000,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 28.0},
        "workload.prompt_tokens": {"kind": "constant", "value": 100},
        "workload.output_tokens": {"kind": "constant", "value": 10},
        "workload.max_tokens": 200,
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_context_token_s": 0.0},
        "kv_capacity_tokens": 100_000,
        "systems": [{"name": "rr8", "scheduler": {"kind": "paged", "max_num_seqs": 1},
                     "cluster": {"router": {"kind": "round_robin"},
                                 "replicas": [{"count": 7}, {"count": 1, "cost": slow}]}}],
    })
    with pytest.warns(UserWarning, match=r"rr8: saturated: 1 of 8 replicas \(7\)"):
        result = run_scenario(scenario).systems["rr8"]
    per_replica = result.replicas
    assert per_replica is not None
    assert per_replica.loc[7, "saturated"] == 1 and per_replica.loc[7, "saturation_z"] > 3
    assert (per_replica.loc[0:6, "saturated"] == 0).all()
    assert result.summary["saturation_z"] < 3  # the pooled queue alone does not show it
    assert result.summary["saturated"] == 1


def test_one_replica_whose_running_set_holds_its_backlog_is_warned_of() -> None:
    """Round robin over 7 replicas and one 3 times slower per token, each with room to run
    everyone (max_num_seqs 1,024): the slow one admits its whole backlog and slows down, with
    no waiting queue, while the fleet's pooled count of requests in the system grew too
    little to warn. The run said nothing (a tester's finding); not flagged, as for a lone
    server whose in-system count alone grew."""
    scenario = make_scenario(**{**SLOW_REPLICA_FLEET, "workload.num_requests": 3000})
    with pytest.warns(UserWarning, match=r"rr8: 1 of 8 replicas \(7\): replica 7: the requests "
                      r"in the system .* though the fleet's pooled count did not show it"):
        result = run_scenario(scenario).systems["rr8"]
    per_replica = result.replicas
    assert per_replica is not None
    assert per_replica.loc[7, "in_system_z"] > 3 and result.summary["in_system_z"] < 3
    assert result.summary["saturated"] == 0


def test_a_group_of_another_model_without_hardware_needs_its_own_kv_capacity() -> None:
    """Without hardware anywhere a group's own model cannot derive its KV pool, and the
    scenario's kv_capacity_tokens was stated for the scenario's model: a group of Llama-2-13B
    beside Llama-2-7B's 5,000 tokens ran with them silently (a tester's note). Refused; the
    same model, or a scenario with no model, keeps the scenario's tokens."""
    def scenario(group: dict[str, object], model: str | None = "llama2-7b") -> Scenario:
        return make_scenario(**{"model": model, "kv_capacity_tokens": 5000,
                                "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                                             "cluster": {"replicas": [{"count": 1}, group]}}]})
    with pytest.raises(ScenarioError) as err:
        scenario({"count": 1, "model": "llama2-13b"})
    assert "systems[0].cluster.replicas[1].model = 'llama2-13b': " in str(err.value), err.value
    assert "kv_capacity_tokens = 5000" in str(err.value) and "hardware" in str(err.value)
    assert scenario({"count": 1, "model": "llama2-13b", "kv_capacity_tokens": 900}).systems
    assert scenario({"count": 1, "model": "llama2-7b"}).systems
    assert scenario({"count": 1, "model": "llama2-13b"}, model=None).systems


@pytest.mark.parametrize(("changes", "message"), [
    ({"systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                   "cluster": {"replicas": [{"count": 1}, {"count": 1, "hardware": {"gpu": "a100-80gb"},
                                                           "cost": {"kind": "roofline"}}]}}]},
     "systems[0].cluster.replicas[1].cost.kind = 'roofline' needs the keys 'model' and 'hardware': "
     "'model' not given"),
    ({"systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                   "cost": {"kind": "roofline"}}]},
     "systems[0].cost.kind = 'roofline' needs the keys 'model' and 'hardware': 'model' and 'hardware' not given"),
    ({"hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"}},
     "cost.kind = 'roofline' needs the keys 'model' and 'hardware': 'model' not given"),
])
def test_a_cost_priced_from_a_deployment_names_its_key_and_what_is_missing(
        changes: dict[str, object], message: str) -> None:
    """A group's roofline without a model anywhere validated (`orcasim validate` passed) and
    failed only at run time, and a system's was reported as the scenario's `cost.kind`,
    saying both keys were needed where the hardware was given (a tester's note)."""
    with pytest.raises(ScenarioError) as err:
        make_scenario(**changes)
    assert str(err.value).endswith(message), err.value


def test_an_idle_replica_has_no_mean_batch_size() -> None:
    """A replica that never ran an iteration has no batch to average (NaN, as a disaggregated
    pool's idle instance reads); it read 0, which pulled a fleet's mean over replicas down."""
    scenario = make_scenario(**{
        "workload.num_requests": 2, "cost": {"kind": "linear", "base_s": 0.125},
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"replicas": 3, "router": {"kind": "round_robin"}}}],
    })
    replicas = run_scenario(scenario).systems["c"].replicas
    assert replicas is not None
    assert replicas["requests_routed"].tolist() == [1.0, 1.0, 0.0]
    assert (replicas["batch_size_mean"].iloc[:2] == 1.0).all()
    assert np.isnan(replicas["batch_size_mean"].iloc[2])


@pytest.mark.parametrize("disaggregated", [False, True])
def test_each_replica_reports_its_own_prefix_cache_evictions(disaggregated: bool) -> None:
    """Conversations on two replicas (or two prefill instances) with prefix caching and a
    pool too small to keep every history: replicas.csv gives each its own evictions, which
    add up to the summary's (it had the system's alone; the prefix tester's note)."""
    cluster = ({"prefill": {"count": 2, "router": {"kind": "round_robin"}}, "decode": {"count": 1}}
               if disaggregated else {"replicas": 2, "router": {"kind": "round_robin"}})
    scenario = {
        "name": "evictions", "seed": 0, "kv_capacity_tokens": 4096,
        "workload": {"max_tokens": 1500, "arrival": {
            "kind": "conversations", "num_sessions": 24, "session_rate_per_s": 2.0,
            "system_prompt": {"tokens": 200, "shared_fraction": 1.0},
            "turns": {"kind": "constant", "value": 3},
            "user_tokens": {"kind": "constant", "value": 100},
            "output_tokens": {"kind": "constant", "value": 20},
            "think_time": {"kind": "constant", "value_s": 1.0}, "max_context_tokens": 1400}},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5},
        "systems": [{"name": "c", "cluster": cluster, "scheduler": {
            "kind": "paged", "max_num_seqs": 16, "max_num_batched_tokens": 2048,
            "enable_prefix_caching": True}}]}
    result = run_scenario(scenario).systems["c"]
    evictions = result.replicas["cache_evictions"]
    assert result.summary["cache_evictions"] > 0
    assert evictions.sum() == result.summary["cache_evictions"]
    assert (evictions.iloc[:2] > 0).all()  # each replica (prefill instance) evicted its own


@pytest.mark.parametrize("scheduler", [
    {"kind": "paged", "max_num_seqs": 8, "preemption": "recompute"},
    {"kind": "paged", "max_num_seqs": 8, "preemption": "swap", "swap_space_bytes": 1e9,
     "kv_bytes_per_token": 1000},
    {"kind": "chunked", "max_num_seqs": 8, "chunk_size_tokens": 64},
])
def test_each_replica_s_rows_count_every_request_in_it_preempted_ones_waiting(scheduler: dict) -> None:
    """Little's law's integrand, replica by replica: at each iteration's start (reference
    mode), its running plus waiting requests are the requests routed there that have arrived
    and not finished. A preempted request waits, as the router's `Load` counts it and vLLM's
    num_requests_waiting does: the rows left it out (2 running and 3 waiting of 6 in the
    system after the first preemption, so `replicas_<system>.png` showed a replica that
    thrashes with fewer requests than it held; a tester's finding)."""
    scenario = make_scenario(**{
        "workload.num_requests": 60, "workload.arrival": {"kind": "poisson", "rate_per_s": 40.0},
        "workload.prompt_tokens": {"kind": "uniform", "low": 20, "high": 60},
        "workload.output_tokens": {"kind": "uniform", "low": 20, "high": 60},
        "workload.max_tokens": 150, "kv_capacity_tokens": 160, "engine.mode": "reference",
        "systems": [{"name": "c", "scheduler": scheduler,
                     "cluster": {"replicas": 2, "router": {"kind": "round_robin"}}}],
    })
    result = run_scenario(scenario).systems["c"]
    reqs, iters = result.requests, result.iterations
    assert iters["preemptions"].sum() > 0
    for row in iters.itertuples():
        mine = reqs[reqs["replica"] == row.replica]
        in_system = int(((mine["arrival_s"] <= row.start_s) & (mine["finish_s"] > row.start_s)).sum())
        assert row.batch_size + row.num_waiting == in_system, row
