"""Sweeps over a cluster's groups and pools: a path into a block a group does not give."""

from __future__ import annotations

from pathlib import Path

import pytest

from orcasim.config import ScenarioError
from orcasim.scenario import load_scenario
from orcasim.sweeps import make_sweep

FLEET = """
name: fleet
seed: 1
workload:
  num_requests: 20
  arrival: {kind: poisson, rate_per_s: 4.0}
  prompt_tokens: {kind: constant, value: 100}
  output_tokens: {kind: constant, value: 10}
  max_tokens: 200
kv_capacity_tokens: 10000
cost: {kind: linear, base_s: 0.01, per_token_s: 0.0001, per_context_token_s: 0.0}
systems:
  - name: het
    scheduler: {kind: paged, max_num_seqs: 8, max_num_batched_tokens: 512}
    cluster:
      replicas:
        - {count: 1}
        - {count: 1, scheduler: {kind: chunked, chunk_size_tokens: 64}}
  - name: pd
    scheduler: {kind: paged, max_num_seqs: 8, max_num_batched_tokens: 512}
    cluster:
      prefill: {count: 1}
      decode: {count: 1}
"""


def _fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def test_a_path_into_a_groups_inherited_scheduler_starts_from_the_systems(tmp_path: Path) -> None:
    """A group that gives no scheduler runs its system's: sweeping its batch limit was
    refused ('scheduler.kind: Field required'), and sweeping its kind to the one it runs
    gave vLLM's defaults (256 sequences, not the system's 8) without a word."""
    sweep = make_sweep(_fleet(tmp_path), {
        "systems[0].cluster.replicas[0].scheduler.max_num_seqs": [4, 16],
        "systems[1].cluster.decode.scheduler.kind": ["paged", "chunked"],
        "systems[1].cluster.prefill.cost.base_s": [0.02, 0.03]}, mode="zip")
    first, second = (task.scenario() for task in sweep.tasks())
    group = first.systems[0].cluster.groups()[0].scheduler
    assert (group.kind, group.max_num_seqs, group.max_num_batched_tokens) == ("paged", 4, 512)
    decode = first.systems[1].cluster.decode.scheduler
    assert (decode.kind, decode.max_num_seqs, decode.max_num_batched_tokens) == ("paged", 8, 512)
    assert first.systems[1].cluster.prefill.cost.per_token_s == 0.0001  # the scenario's, but base_s
    assert second.systems[1].cluster.decode.scheduler.kind == "chunked"  # another kind: its defaults
    assert second.systems[1].cluster.decode.scheduler.max_num_seqs == 256


def test_a_set_into_a_pools_inherited_scheduler_starts_from_the_systems(tmp_path: Path) -> None:
    """`--set` on the scenario file means the same as the grid."""
    scenario = load_scenario(_fleet(tmp_path), ["systems[1].cluster.decode.scheduler.max_num_seqs=4",
                                                "systems[0].cluster.replicas[0].scheduler.kind=paged"])
    decode = scenario.systems[1].cluster.decode.scheduler
    assert (decode.kind, decode.max_num_seqs, decode.max_num_batched_tokens) == ("paged", 4, 512)
    assert scenario.systems[0].cluster.groups()[0].scheduler.max_num_seqs == 8


def test_a_count_over_a_list_of_groups_is_refused(tmp_path: Path) -> None:
    """`cluster.replicas` set to a count where the file gives groups ran that many of the
    system's own replica: a grid over `replicas: [4, 8]` of a mixed fleet ran plain paged
    fleets, its chunked group gone, without a word. It names the key and the two ways that
    keep or replace the groups on purpose, as --set, a sweep's set: and its grid alike."""
    expected = (r"systems\[0\].cluster.replicas: 4 would replace its 2 groups \(2 replicas\) "
                r"with 4 of the system's own replica, dropping what each group gives; expected a "
                r"group's count, e.g. systems\[0\].cluster.replicas\[0\].count=4, or a whole list, "
                r"e.g. systems\[0\].cluster.replicas=\[\{count: 4\}\]$")
    with pytest.raises(ScenarioError, match=rf"^point p0000-r00 \(systems\[0\].cluster.replicas=4\): "
                       rf"{expected}"):
        make_sweep(_fleet(tmp_path), {"systems[0].cluster.replicas": [4]}).tasks()[0].scenario()
    with pytest.raises(ScenarioError, match=r"^override "
                       r"'systems\[0\].cluster.replicas': 4 would replace its 2 groups"):
        load_scenario(_fleet(tmp_path), ["systems[0].cluster.replicas=4"])
    kept = load_scenario(_fleet(tmp_path), ["systems[0].cluster.replicas[1].count=3"])
    assert [g.count for g in kept.systems[0].cluster.groups()] == [1, 3]
    whole = load_scenario(_fleet(tmp_path), ["systems[0].cluster.replicas=[{count: 4}]"])
    assert [g.count for g in whole.systems[0].cluster.groups()] == [4]
