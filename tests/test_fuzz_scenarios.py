"""Fuzz: scenarios with extreme and mistyped values either run to finite metrics (exit 0) or
are refused in one line (exit 2). Never a traceback, never a non-finite headline metric.

Each example takes a small valid scenario and replaces a few of its values, drawn from a
menu per key: extremes (0, negatives, 1e-300, 1e300, 10**18), the wrong type (strings,
booleans, lists, null) and ordinary values. The request count stays small so that a valid
example runs in a fraction of a second; the engine mode stays fast.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.scenario import set_dotted
from tests.conftest import BASE as CONFTEST_BASE
from tests.conftest import examples

EXAMPLES = 150  # the fuzz's size: examples per CI run (derandomized, so the same ones)
# conftest's scenario, shortened, with a paged system beside request-level and Orca.
BASE: dict[str, Any] = {**copy.deepcopy(CONFTEST_BASE), "name": "fuzz", "kv_capacity_tokens": 4000}
BASE["workload"]["num_requests"] = 40
BASE["systems"] = [
    {"name": "rl", "scheduler": {"kind": "request_level", "max_batch_size": 4}},
    {"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}},
    {"name": "vllm", "scheduler": {"kind": "paged", "max_num_seqs": 8, "max_num_batched_tokens": 512}},
]
HEADLINE = ("throughput_rps", "duration_s", "e2e_s_mean", "e2e_s_p99", "ttft_s_p50")

numbers = st.one_of(
    st.sampled_from([0, -1, 1, 2, 0.5, 1e-300, 1e-9, 1e9, 1e300, 10**18, -1e300]),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.integers(min_value=-10, max_value=10**6),
)
wrong = st.sampled_from(["x", "", True, False, None, [], {}, [1, 2], "1e400", "nan"])
value = st.one_of(numbers, wrong)
lengths = st.one_of(
    st.fixed_dictionaries({"kind": st.just("constant"), "value": value}),
    st.fixed_dictionaries({"kind": st.just("uniform"), "low": value, "high": value}),
    st.fixed_dictionaries({"kind": st.just("lognormal"), "mean": value, "sigma": value,
                           "max": value}),
    wrong,
)
arrivals = st.one_of(
    st.fixed_dictionaries({"kind": st.sampled_from(["poisson", "constant"]), "rate_per_s": value}),
    st.fixed_dictionaries({"kind": st.just("gamma"), "rate_per_s": value, "cv": value}),
    st.fixed_dictionaries({"kind": st.just("closed_loop"), "num_clients": value,
                           "think_time": st.fixed_dictionaries({"kind": st.just("constant"),
                                                                "value_s": value})}),
    wrong,
)
CHANGES = {
    "seed": value,
    "warmup_s": value,
    "kv_capacity_tokens": value,
    "workload.max_tokens": value,
    "workload.arrival": arrivals,
    "workload.prompt_tokens": lengths,
    "workload.output_tokens": lengths,
    "cost.base_s": value,
    "cost.per_token_s": value,
    "cost.per_context_token_s": value,
    "systems[0].scheduler.max_batch_size": value,
    "systems[1].scheduler.max_batch_size": value,
    "systems[2].scheduler.max_num_seqs": value,
    "systems[2].scheduler.max_num_batched_tokens": value,
    "systems[2].scheduler.block_size_tokens": value,
    "systems[2].scheduler.watermark": value,
    "systems[1].name": st.sampled_from(["summary.json", "a b", "orca", "x.png", "ok"]),
}
changes = st.dictionaries(st.sampled_from(sorted(CHANGES)), st.none(), min_size=1, max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: CHANGES[k] for k in keys}))

runner = CliRunner()


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=examples(EXAMPLES), suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                         HealthCheck.too_slow])
@given(changed=changes)
# Found by this test, kept: a gamma cv so small its shape overflowed; a negative seed.
@example(changed={"workload.arrival": {"kind": "gamma", "rate_per_s": 1, "cv": 1e-300}})
@example(changed={"seed": -10, "warmup_s": 213106})
@example(changed={"workload.arrival": {"kind": "constant", "rate_per_s": 1e300}})
def test_a_scenario_runs_to_finite_metrics_or_is_refused_in_one_line(
        tmp_path_factory: Any, changed: dict[str, Any]) -> None:
    data = copy.deepcopy(BASE)
    for path, new in changed.items():
        set_dotted(data, path, new)
    folder: Path = tmp_path_factory.mktemp("fuzz")
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(path), "--out", str(folder / "out"), "--no-plots"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: the failure this test exists to find
    assert result.exit_code in (0, 2), (changed, result.output)
    if result.exit_code == 2:
        lines = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in result.output, (changed, result.output)
        return
    summary = json.loads((folder / "out" / "summary.json").read_text())
    for system, metrics in summary.items():
        for key in HEADLINE:
            value = metrics.get(key)
            assert value is not None and math.isfinite(value), (changed, system, key, value)
