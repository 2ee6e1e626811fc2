"""The `fitted` cost kind: loading, range warnings, the decode fast path, DistServe's JSON."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from orcasim.config import ScenarioError
from orcasim.cost import build_cost_model
from orcasim.cost.base import Batch
from orcasim.cost.fitted import FORMAT, FittedCostConfig, term_names

ROOT = Path(__file__).resolve().parents[1]
KNOTS = [64]
COEF = dict(zip(term_names(KNOTS), [1e-3, 2e-5, 1e-4, 3e-7, 1e-8, 5e-6], strict=True))
RANGE = {"tokens": [1, 512], "num_requests": [1, 16], "sum_context_decode": [0, 4096],
         "sum_prefill_sq": [0, 262144], "max_context": [1, 512]}


@pytest.fixture
def cost_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.yaml"
    doc = {"format": FORMAT, "knots_tokens": KNOTS, "coefficients_s": COEF, "range": RANGE}
    path.write_text(yaml.safe_dump(doc))
    return path


def build(path: Path, **extra: object):
    return build_cost_model(FittedCostConfig(kind="fitted", path=str(path), **extra))


def batch(query: list[int], context: list[int]) -> Batch:
    return Batch(np.array(query, dtype=np.int64), np.array(context, dtype=np.int64))


def test_formula(cost_file: Path) -> None:
    cost = build(cost_file)
    # Two decodes (contexts 10, 20) and a prompt of 100: tokens 102, over the knot by 38.
    got = cost.iteration_time_s(batch([1, 1, 100], [10, 20, 100]))
    want = (COEF["const"] + 102 * COEF["tokens"] + 3 * COEF["num_requests"]
            + 30 * COEF["sum_context_decode"] + 100 * 100 * COEF["sum_prefill_sq"]
            + 38 * COEF["tokens_over_64"])
    assert got == pytest.approx(want, rel=1e-12)
    assert cost.out_of_range_count() == 0


def test_out_of_range_counts_and_warns_once(cost_file: Path) -> None:
    cost = build(cost_file)
    with pytest.warns(RuntimeWarning, match="outside the fitted range") as record:
        cost.iteration_time_s(batch([1] * 20, [10] * 20))  # 20 requests > 16
        cost.iteration_time_s(batch([600], [600]))  # 600 tokens > 512
    assert len(record) == 1
    assert cost.out_of_range_count() == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh instance warns again; in range it never warns
        build(cost_file).iteration_time_s(batch([1], [5]))


def test_decode_steps_match_iterations(cost_file: Path) -> None:
    context = np.array([10, 50, 200], dtype=np.int64)
    cost = build(cost_file)
    with pytest.warns(RuntimeWarning, match="decode step"):
        fast = cost.decode_steps_s(context, 400)  # runs past max_context 512 after 312 steps
    slow_cost = build(cost_file)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        slow = [slow_cost.iteration_time_s(Batch(np.ones(3, dtype=np.int64), context + j))
                for j in range(400)]
    assert fast.tolist() == slow  # bit for bit: fast mode is exact with this model
    assert cost.out_of_range_count() == slow_cost.out_of_range_count() == 400 - 313


def test_decode_steps_count_a_batch_too_large(cost_file: Path) -> None:
    cost = build(cost_file)
    with pytest.warns(RuntimeWarning):
        cost.decode_steps_s(np.full(20, 10, dtype=np.int64), 7)  # 20 requests > 16: every step
    assert cost.out_of_range_count() == 7


def test_decode_steps_count_a_fit_that_saw_no_pure_decode(tmp_path: Path) -> None:
    # sum_prefill_sq from 4096: a decode step's 0 is outside. iteration_time_s counted each
    # such step; decode_steps_s (fast mode) checked every input but this one and counted 0.
    path = tmp_path / "m.yaml"
    fit_range = {**RANGE, "sum_prefill_sq": [4096, 262144]}
    path.write_text(yaml.safe_dump({"format": FORMAT, "knots_tokens": KNOTS,
                                    "coefficients_s": COEF, "range": fit_range}))
    context = np.array([10, 50], dtype=np.int64)
    fast, slow = build(path), build(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fast.decode_steps_s(context, 5)
        for j in range(5):
            slow.iteration_time_s(Batch(np.ones(2, dtype=np.int64), context + j))
    assert fast.out_of_range_count() == slow.out_of_range_count() == 5


def test_bad_files(tmp_path: Path, cost_file: Path) -> None:
    with pytest.raises(ScenarioError, match="not found"):
        build(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("kind: something-else\n")
    with pytest.raises(ScenarioError, match="format"):
        build(tmp_path / "bad.yaml")
    with pytest.raises(ScenarioError, match="only to a DistServe"):
        build(cost_file, model="opt-13b")


def test_committed_cpu_model_loads() -> None:
    cost = build(ROOT / "calibrate" / "cost_models" / "cpu-tiny.yaml")
    t = cost.iteration_time_s(batch([1, 1, 64], [100, 200, 64]))
    assert 0 < t < 1.0
    assert cost.out_of_range_count() == 0


# DistServe: A100-80GB, OPT-13B, TP 1 (vLLM engine), coefficients in ms from the JSON.
DISTSERVE = "profiles/distserve/profiler-a100-80g.vllm.json"


def distserve(**extra: object):
    cfg = {"model": "opt-13b", "tensor_parallel": 1, **extra}
    return build_cost_model(FittedCostConfig(kind="fitted", path=DISTSERVE, **cfg))


def test_distserve_prefill_and_decode_formulas() -> None:
    import json

    from orcasim.paths import PACKAGE_DATA_DIR

    entry = json.loads((PACKAGE_DATA_DIR / DISTSERVE).read_text())["facebook/opt-13b"]["1"]
    a, b, c = entry["prefill"]
    cost = distserve()
    assert cost.iteration_time_s(batch([100, 300], [100, 300])) == pytest.approx(
        (a + b * 400 + c * (100**2 + 300**2)) * 1e-3, rel=1e-12)
    a, b, c = entry["decoding_smallbs"]
    assert cost.iteration_time_s(batch([1] * 4, [500] * 4)) == pytest.approx(
        (a + b * 2000 + c * 4) * 1e-3, rel=1e-12)
    n = entry["decoding_large_small_bs_threshold"]
    a, b, c = entry["decoding_largebs"]
    assert cost.iteration_time_s(batch([1] * n, [100] * n)) == pytest.approx(
        (a + b * 100 * n + c * n) * 1e-3, rel=1e-12)


def test_distserve_decode_steps_and_capacity() -> None:
    cost, ref = distserve(), distserve()
    context = np.full(8, 8000, dtype=np.int64)  # 64,000 KV tokens; capacity 66,144 at TP 1
    with pytest.warns(RuntimeWarning, match="decode step"):
        fast = cost.decode_steps_s(context, 400)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        slow = [ref.iteration_time_s(Batch(np.ones(8, dtype=np.int64), context + j)) for j in range(400)]
    assert fast.tolist() == slow  # bit for bit: fast mode is exact with this model
    over = int(np.sum(64000 + 8 * np.arange(400) > 66144))
    assert cost.out_of_range_count() == ref.out_of_range_count() == over > 0


def test_distserve_needs_model_and_tp() -> None:
    with pytest.raises(ScenarioError, match="needs cost.model"):
        build_cost_model(FittedCostConfig(kind="fitted", path=DISTSERVE))
    with pytest.raises(ScenarioError, match="opt-7b"):
        distserve(model="opt-7b")
    with pytest.raises(ScenarioError, match="tensor_parallel = 3"):
        distserve(tensor_parallel=3)


def test_a_distserve_profile_of_another_model_or_degree_than_the_deployment_warns() -> None:
    """A DistServe profile prices its own model at its own TP degree: on a deployment of
    another (`--set hardware.tensor_parallel=4` on scenarios/validation/vllm_opt13b_a100.yaml)
    the run gave the TP 1 profile's times unchanged, with nothing said (a tester's finding)."""
    from orcasim.cost import Deployment
    from orcasim.cost.catalog import HardwareConfig, model_spec

    def built(model: str, tp: int) -> None:
        deployment = Deployment(model=model_spec(model),
                                hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=tp))
        build_cost_model(FittedCostConfig(kind="fitted", path=DISTSERVE, model="opt-13b",
                                          tensor_parallel=1), deployment)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built("opt-13b", 1)  # the profile's own: nothing to say
    with pytest.warns(UserWarning, match=r"cost\.tensor_parallel = 1: .* hardware\.tensor_parallel = 4"):
        built("opt-13b", 4)
    with pytest.warns(UserWarning, match=r"cost\.model = 'opt-13b': .* model 'opt-66b'"):
        built("opt-66b", 1)



def test_a_distserve_profile_at_another_degree_than_hardware_without_a_model_warns() -> None:
    """The same TP mismatch where the scenario gives hardware and no model (a KV capacity of
    its own): hardware.tensor_parallel = 4 priced at the TP 1 profile's times unsaid."""
    from orcasim.cost.catalog import HardwareConfig

    cfg = FittedCostConfig(kind="fitted", path=DISTSERVE, model="opt-13b", tensor_parallel=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_cost_model(cfg, None, HardwareConfig(gpu="a100-80gb", tensor_parallel=1))
    with pytest.warns(UserWarning, match=r"cost\.tensor_parallel = 1: .* hardware\.tensor_parallel = 4"):
        build_cost_model(cfg, None, HardwareConfig(gpu="a100-80gb", tensor_parallel=4))


def test_a_profile_fit_of_another_model_than_the_deployment_warns() -> None:
    """A fit from `python -m calibrate fit` names the model it was profiled on
    (provenance.model): the committed H200 fit of GPT-3 13B priced a Llama-2-70B
    deployment's iterations, with nothing said (a tester's finding)."""
    from orcasim.cost import Deployment
    from orcasim.cost.catalog import HardwareConfig, model_spec

    fit = str(ROOT / "calibrate" / "cost_models" / "gpu-h200-gpt3-13b.yaml")

    def built(model: str, tp: int) -> None:
        deployment = Deployment(model=model_spec(model),
                                hardware=HardwareConfig(gpu="h200", tensor_parallel=tp))
        build_cost_model(FittedCostConfig(kind="fitted", path=fit), deployment)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built("gpt3-13b", 1)
    with pytest.warns(UserWarning, match=r"gpu-h200-gpt3-13b\.yaml was fitted on model 'gpt3-13b'.* "
                                         r"model 'llama2-70b'"):
        built("llama2-70b", 4)


def test_a_profile_fit_at_another_degree_than_the_deployment_warns() -> None:
    """`python -m calibrate profile` times one device (TP 1): its fit priced a TP 4
    deployment of the same model at the TP 1 times, unsaid (a run of gpt3-13b on h200 at
    TP 1 and TP 4 gave the same e2e p90, 25.68 s; a tester's finding)."""
    from orcasim.cost import Deployment
    from orcasim.cost.catalog import HardwareConfig, model_spec

    fit = str(ROOT / "calibrate" / "cost_models" / "gpu-h200-gpt3-13b.yaml")

    def built(tp: int) -> None:
        deployment = Deployment(model=model_spec("gpt3-13b"),
                                hardware=HardwareConfig(gpu="h200", tensor_parallel=tp))
        build_cost_model(FittedCostConfig(kind="fitted", path=fit), deployment)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built(1)
    with pytest.warns(UserWarning, match=r"gpu-h200-gpt3-13b\.yaml was profiled at tensor_parallel "
                                         r"1 .* hardware\.tensor_parallel = 4"):
        built(4)
    with pytest.warns(UserWarning, match=r"hardware\.tensor_parallel = 2"):  # hardware alone
        build_cost_model(FittedCostConfig(kind="fitted", path=fit), None,
                         HardwareConfig(gpu="h200", tensor_parallel=2))


def test_a_fit_of_the_same_model_under_another_name_is_silent(tmp_path: Path) -> None:
    """The check compared bare names: a fit of catalog 'llama3.1-70b' warned on the same
    model read from its config.json (named 'llama-3.1-70b'), and a fit of 'gpt3-13b' on
    GPT-3 13B's shape written out (named 'custom'). A catalog name is compared by shape."""
    from orcasim.cost import Deployment
    from orcasim.cost.catalog import HardwareConfig, ModelSpec, model_spec

    source = ROOT / "calibrate" / "cost_models" / "gpu-h200-gpt3-13b.yaml"

    def built(fitted_on: str, model: ModelSpec) -> None:
        fit = tmp_path / f"{fitted_on}.yaml"
        fit.write_text(source.read_text().replace("model: gpt3-13b", f"model: {fitted_on}"))
        deployment = Deployment(model=model, hardware=HardwareConfig(gpu="h200"))
        build_cost_model(FittedCostConfig(kind="fitted", path=str(fit)), deployment)

    shape = model_spec("gpt3-13b").model_dump(exclude={"name", "source"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built("llama3.1-70b", ModelSpec.model_validate(
            {"hf_config": "hf_configs/llama-3.1-70b/config.json"}))
        built("gpt3-13b", ModelSpec.model_validate(shape))
    with pytest.warns(UserWarning, match=r"fitted on model 'gpt3-13b'.* model 'custom'"):
        built("gpt3-13b", ModelSpec.model_validate({**shape, "num_layers": 80}))


def test_a_fit_of_some_layers_says_so_when_loaded(tmp_path: Path) -> None:
    """A fit of the profiled layers' own times (`calibrate fit --target measured_s` on a
    4-of-40-layer profile) said so at fit time alone: loaded by a scenario later, it priced
    the whole model 10 times cheap without a word (a left-alone note)."""
    source = ROOT / "calibrate" / "cost_models" / "gpu-h200-gpt3-13b.yaml"
    fit = tmp_path / "measured.yaml"
    fit.write_text(source.read_text().replace(
        "  model: gpt3-13b\n", "  model: gpt3-13b\n  fitted_layers: 4 of 40 (measured_s)\n"))
    with pytest.warns(UserWarning, match=r"measured\.yaml was fitted on the time of 4 of 40 "
                                         r"\(measured_s\): it prices those layers, not the whole"):
        build_cost_model(FittedCostConfig(kind="fitted", path=str(fit)))


def test_calibrated_scenario_runs() -> None:
    import orcasim

    result = orcasim.run_scenario(ROOT / "scenarios" / "calibrated" / "cpu_tiny.yaml",
                                  ("workload.num_requests=30",))
    orca = result.systems["orca"].summary
    assert orca["requests_completed"] == 30
    assert orca["cost_out_of_range"] == 0


# --- a cost calibrated from serving logs, loaded directly (what the mutation run found unpinned) ---

def _calibrated(tmp_path: Path, cost: object, name: str = "cal.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"format": "orcasim-calibrated-cost/v1", "cost": cost}))
    return path


def test_a_calibrated_cost_is_built_as_if_the_scenario_held_its_block(tmp_path: Path) -> None:
    from orcasim.cost.catalog import Deployment, HardwareConfig, model_spec
    from orcasim.cost.roofline import RooflineCostConfig

    block = {"kind": "roofline", "compute_efficiency": 0.5, "overhead": {"per_iteration_s": 0.002, "per_sequence_s": 1e-4}}
    deployment = Deployment(model=model_spec("opt-13b"), hardware=HardwareConfig(gpu="a100-80gb"))
    loaded = build_cost_model(FittedCostConfig(kind="fitted", path=str(_calibrated(tmp_path, block))), deployment)
    inline = build_cost_model(RooflineCostConfig.model_validate(block), deployment)
    batch = Batch(np.array([1, 1, 300]), np.array([500, 90, 300]))
    assert loaded.iteration_time_s(batch) == inline.iteration_time_s(batch)
    linear = build(_calibrated(tmp_path, {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4}, "lin.yaml"))
    assert linear.iteration_time_s(batch) == pytest.approx(0.01 + 302 * 1e-4, rel=1e-15)


def test_a_calibrated_cost_that_is_not_a_cost_block_names_its_file_and_key(tmp_path: Path) -> None:
    path = _calibrated(tmp_path, {"kind": "linear", "base_s": -1.0})
    with pytest.raises(ScenarioError, match=r"^cal\.yaml: cost: base_s = -1\.0: Input should be greater than or equal to 0$"):
        build(path)
    with pytest.raises(ScenarioError, match=r"^cal\.yaml: cost"):
        build(_calibrated(tmp_path, None))


def test_a_calibrated_cost_may_not_load_itself(tmp_path: Path) -> None:
    path = _calibrated(tmp_path, {"kind": "fitted", "path": str(tmp_path / "cal.yaml")})
    with pytest.raises(ScenarioError, match=f"^cost.path = '{path}': a calibrated cost may not "
                                            "load itself; expected a chain"):
        build(path)


def test_calibrated_costs_that_load_each_other_are_one_line(tmp_path: Path) -> None:
    """Two files that load each other recursed to a traceback (a tester's finding)."""
    a = _calibrated(tmp_path, {"kind": "fitted", "path": str(tmp_path / "b.yaml")}, "a.yaml")
    _calibrated(tmp_path, {"kind": "fitted", "path": str(a)}, "b.yaml")
    with pytest.raises(ScenarioError, match=r"a calibrated cost loads itself through .*a\.yaml -> "
                                            r".*b\.yaml -> .*a\.yaml"):
        build(a)


def test_a_calibrated_cost_loads_a_profile_fit_of_its_own_name(tmp_path: Path) -> None:
    """calibrate logs --out cal/cost.yaml on a scenario loading prof/cost.yaml wrote a file
    refused as loading itself: the names were compared, not the files (a tester's)."""
    (tmp_path / "prof").mkdir()
    (tmp_path / "cal").mkdir()
    profile = tmp_path / "prof" / "cost.yaml"
    profile.write_text((ROOT / "calibrate" / "cost_models" / "cpu-tiny.yaml").read_text())
    calibrated = _calibrated(tmp_path / "cal", {"kind": "fitted", "path": str(profile)}, "cost.yaml")
    assert build(calibrated).iteration_time_s(batch([4], [4])) == build(profile).iteration_time_s(
        batch([4], [4]))


def test_a_calibrated_cost_s_way_in_is_its_own_and_its_overhead_is_not_stacked(
        tmp_path: Path) -> None:
    """A log calibration can fit `overhead.request_latency_s`; loaded from its file it was
    dropped unread (TTFT p50 0.015 s, not 0.515 s), and a second overhead given beside the
    path was added on top of the file's."""
    import orcasim
    from orcasim.scenario import scenario_from_dict

    block = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4,
             "overhead": {"per_iteration_s": 0.002, "request_latency_s": 0.5}}
    path = _calibrated(tmp_path, block)
    data = {"name": "s", "kv_capacity_tokens": 4000,
            "workload": {"num_requests": 20, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                         "prompt_tokens": {"kind": "uniform", "low": 8, "high": 64},
                         "output_tokens": {"kind": "uniform", "low": 2, "high": 16},
                         "max_tokens": 128},
            "systems": [{"name": "p", "scheduler": {"kind": "paged", "max_num_seqs": 8}}]}

    def requests(cost: dict) -> object:
        scenario = scenario_from_dict({**data, "cost": cost})
        return orcasim.run_scenario(scenario).systems["p"].requests

    loaded, inline = requests({"kind": "fitted", "path": str(path)}), requests(block)
    assert loaded["ttft_s"].tolist() == inline["ttft_s"].tolist()
    assert loaded["ttft_s"].min() > 0.5
    with pytest.raises(ScenarioError, match=r"^cost.overhead: cost.path = .* holds its own overhead"):
        requests({"kind": "fitted", "path": str(path), "overhead": {"per_iteration_s": 0.001}})
    # A calibrated cost without an overhead takes one given beside its path.
    bare = _calibrated(tmp_path, {"kind": "linear", "base_s": 0.01}, "bare.yaml")
    added = requests({"kind": "fitted", "path": str(bare), "overhead": {"request_latency_s": 0.5}})
    assert added["ttft_s"].min() > 0.5


def test_the_contracts_defaults_price_steps_and_lists_by_iteration_time() -> None:
    """A cost model that only prices a batch: its decode steps and its lists path are
    `iteration_time_s`'s own, and it has no decode line."""
    from orcasim.cost.base import CostModel

    class Squares(CostModel):
        def iteration_time_s(self, batch: Batch) -> float:
            c = batch.context_tokens
            return float((c.astype(np.float64) ** 2).sum() * 1e-9 + batch.total_query_tokens * 1e-4
                         + batch.total_context_tokens * 1e-7)

    cost = Squares()
    context = np.array([10, 400, 75])
    steps = cost.decode_steps_s(context, 4)
    expected = [cost.iteration_time_s(Batch(np.ones(3, dtype=np.int64), context + j)) for j in range(4)]
    assert steps.tolist() == expected and expected[3] > expected[0]
    assert cost.iteration_time_lists_s([1, 30], [400, 30], 31, 430) == cost.iteration_time_s(
        Batch(np.array([1, 30]), np.array([400, 30])))
    assert cost.decode_line(3, 485) is None


def test_distserve_prices_a_mixed_batch_as_its_prompts_plus_its_decodes_by_hand() -> None:
    """A prompt of 100 beside 2 decodes at 500 and 700: the prefill formula (its constant
    included) plus the small-batch decode terms without their constant (DistServe's
    mixed-batch rule)."""
    import json

    from orcasim.paths import PACKAGE_DATA_DIR

    entry = json.loads((PACKAGE_DATA_DIR / DISTSERVE).read_text())["facebook/opt-13b"]["1"]
    a_p, b_p, c_p = entry["prefill"]
    _, b_d, c_d = entry["decoding_smallbs"]
    expected_ms = (a_p + b_p * 100 + c_p * 100 * 100) + (b_d * 1200 + c_d * 2)
    got = distserve().iteration_time_s(batch([1, 100, 1], [500, 100, 700]))
    assert got == pytest.approx(expected_ms * 1e-3, rel=1e-12)


def test_distserve_needs_its_model_and_tensor_parallelism_and_reads_facebook_names() -> None:
    message = ("^cost.path = 'profiler-a100-80g.vllm.json': a DistServe profile needs cost.model and "
               "cost.tensor_parallel$")
    for missing in ({"tensor_parallel": None}, {"model": None}):
        with pytest.raises(ScenarioError, match=message):
            distserve(**missing)
    assert distserve(model="facebook/opt-13b").iteration_time_s(batch([1], [100])) == \
        distserve().iteration_time_s(batch([1], [100]))


@pytest.mark.parametrize(("text", "message"), [
    ("{oops", r"p\.json: not valid JSON \(Expecting property name enclosed in double quotes "
              r"at line 1\)"),
    ("[" * 100_000 + "]" * 100_000, r"p\.json: not valid JSON \(nested too deeply\)"),  # RecursionError
    ("[1, 2]", "expected DistServe's profile JSON, a mapping of model names to"),
    ("{}", "expected DistServe's profile JSON"),
    ('{"opt-13b": {"1": {}}}', "opt-13b: 1: prefill: Field required"),
    ('{"opt-13b": {"1": {"prefill": [1, "x", 3], "decoding_smallbs": [1, 2, 3], '
     '"decoding_largebs": [1, 2, 3], "decoding_large_small_bs_threshold": 8}}}',
     r"opt-13b: 1: prefill\[1\] = 'x': Input should be a valid number"),
])
def test_a_bad_distserve_profile_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    """Each was a traceback (JSONDecodeError, TypeError, KeyError, ValueError) or, for {},
    'expected one of' an empty list."""
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"^cost.path = 'p.json'|^cost.model") as err:
        build(path, model="opt-13b", tensor_parallel=1)
    assert re.search(message, str(err.value)) and "\n" not in str(err.value), str(err.value)


def test_a_fitted_cost_names_its_file_and_what_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"format": FORMAT, "knots_tokens": KNOTS,
                                    "coefficients_s": {"const": 1e-3}, "range": RANGE}))
    with pytest.raises(ScenarioError, match=r"^bad\.yaml: coefficients_s lacks tokens, num_requests, "
                                            r"sum_context_decode, sum_prefill_sq, tokens_over_64$"):
        build(path)
    path.write_text("format: [unclosed")
    with pytest.raises(ScenarioError, match=f"^cost.path = '{path}': cannot read a fitted cost model "
                                            r"\(expected ',' or '\]', but got '<stream end>' at "
                                            r"line 1, column 18\)$"):
        build(path)  # YAML's own message ran over five lines
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")  # a RecursionError traceback
    with pytest.raises(ScenarioError, match=r"cannot read a fitted cost model \(nested too deeply"):
        build(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ScenarioError, match=r"cannot read a fitted cost model \(not UTF-8 text\)$"):
        build(path)  # a UnicodeDecodeError traceback
    # Contents of the wrong kind: a ValueError or KeyError traceback each.
    for changes, message in (({"coefficients_s": {**COEF, "tokens": "x"}}, "coefficients_s.tokens = 'x'"),
                             ({"range": None}, "range = null: expected a mapping of its keys"),
                             ({"knots_tokens": [-1]}, "knots_tokens[0] = -1")):
        path.write_text(yaml.safe_dump({"format": FORMAT, "knots_tokens": KNOTS,
                                        "coefficients_s": COEF, "range": RANGE} | changes))
        with pytest.raises(ScenarioError, match=rf"^bad\.yaml: {re.escape(message)}") as err:
            build(path)
        assert "\n" not in str(err.value)
    path.write_text(yaml.safe_dump({"format": "other"}))
    with pytest.raises(ScenarioError, match=f"^cost.path = '{path}': expected a YAML file with format: "):
        build(path)


def test_a_fitted_cost_without_knots_or_ranges_is_plain_and_never_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    coef = dict(zip(term_names([]), [1e-3, 2e-5, 1e-4, 3e-7, 1e-8], strict=True))
    path.write_text(yaml.safe_dump({"format": FORMAT, "coefficients_s": coef, "range": {}}))
    cost = build(path)
    assert cost.iteration_time_s(batch([1, 1], [10**6, 10**6])) > 0
    cost.decode_steps_s(np.full(3, 10**6), 4)
    assert cost.out_of_range_count() == 0


def test_a_fitted_ranges_ends_are_inside(cost_file: Path) -> None:
    """`tokens` and `max_context` span [1, 512]: a batch at those ends is inside, one
    token more is out and warns naming the file."""
    cost = build(cost_file)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cost.iteration_time_s(batch([1], [1]))
        cost.decode_steps_s(np.array([512]), 1)
        cost.decode_steps_s(np.array([1]), 1)  # max_context at its low end, 1
    assert cost.out_of_range_count() == 0
    with pytest.warns(RuntimeWarning, match=r"^cost model m\.yaml: .* is outside the fitted range"):
        cost.iteration_time_s(batch([513], [513]))
    assert cost.out_of_range_count() == 1


def test_linear_decode_lines_start_at_one_request() -> None:
    from orcasim.cost.linear import LinearCost, LinearCostConfig

    cost = LinearCost(LinearCostConfig(kind="linear", base_s=0.01, per_token_s=1e-4, per_context_token_s=1e-6))
    assert cost.decode_line(0, 0) is None
    line = cost.decode_line(1, 100)
    assert line is not None and line.intercept_s == pytest.approx(0.01 + 1e-4, rel=1e-15)


def test_distserve_reads_the_capacity_of_its_model_and_tensor_parallelism(tmp_path: Path) -> None:
    from orcasim.cost.distserve import _kv_capacity_tokens

    table = tmp_path / "max_num_tokens.csv"
    table.write_text("model,tp,pp,max_num_tokens\nm,1,1,100\nm,2,1,200\nm,1,2,300\nn,1,1,400\n")
    assert [_kv_capacity_tokens(table, "m", tp) for tp in (1, 2, 4)] == [100.0, 200.0, float("inf")]
    assert _kv_capacity_tokens(table, "n", 2) == float("inf")
    assert _kv_capacity_tokens(tmp_path / "none.csv", "m", 1) == float("inf")


def test_fitted_decode_steps_check_the_batch_size_and_the_context_sum(cost_file: Path) -> None:
    """600 decodes a step: beyond `tokens` (512), every step counted; 8 decodes reading 600
    each: 4,800 KV tokens, beyond `sum_context_decode` (4,096)."""
    for context, steps in ((np.full(600, 10), 2), (np.full(8, 600), 3)):
        cost = build(cost_file)
        with pytest.warns(RuntimeWarning, match=r"^cost model m\.yaml: a decode step of \d+ requests is outside "
                                                r"the fitted range; the value is an extrapolation \(further cases "
                                                r"are counted in cost_out_of_range\)$"):
            cost.decode_steps_s(context, steps)
        assert cost.out_of_range_count() == steps


def test_the_formats_a_fitted_cost_reads_are_named(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"format": "other"}))
    with pytest.raises(ScenarioError, match=r"expected a YAML file with format: orcasim-fitted-cost/v\d+ "
                                            r"\(python -m calibrate fit\) or orcasim-calibrated-cost/v1 "
                                            r"\(python -m calibrate logs\)$"):
        build(path)


def test_distserve_names_the_models_and_degrees_it_has() -> None:
    with pytest.raises(ScenarioError, match=r"^cost.model = 'llama-9': expected one of facebook/opt-13b, "):
        distserve(model="llama-9")
    with pytest.raises(ScenarioError, match=r"^cost.tensor_parallel = 3: facebook/opt-13b was profiled at 1, 2, "):
        distserve(tensor_parallel=3)


def test_a_decode_steps_token_count_is_checked_on_its_own(tmp_path: Path) -> None:
    """Fitted on batches of up to 1,000 requests but 512 tokens: 600 decodes are out."""
    path = tmp_path / "m.yaml"
    doc = {"format": FORMAT, "knots_tokens": KNOTS, "coefficients_s": COEF,
           "range": {**RANGE, "num_requests": [1, 1000], "sum_context_decode": [0, 10**6]}}
    path.write_text(yaml.safe_dump(doc))
    cost = build(path)
    with pytest.warns(RuntimeWarning, match="a decode step of 600 requests"):
        cost.decode_steps_s(np.full(600, 10), 2)
    assert cost.out_of_range_count() == 2


def test_a_fitted_batch_below_the_knot_has_no_hinge_term(cost_file: Path) -> None:
    """One decode at 100 tokens of context: const + tokens + requests + decode context; the
    hinge max(0, tokens - 64) adds nothing."""
    expected = 1e-3 + 2e-5 * 1 + 1e-4 * 1 + 3e-7 * 100
    assert build(cost_file).iteration_time_s(batch([1], [100])) == pytest.approx(expected, rel=1e-12)


def test_a_decode_steps_context_sum_is_checked_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    doc = {"format": FORMAT, "knots_tokens": KNOTS, "coefficients_s": COEF,
           "range": {**RANGE, "max_context": [1, 10**6]}}
    path.write_text(yaml.safe_dump(doc))
    cost = build(path)
    with pytest.warns(RuntimeWarning, match="a decode step of 8 requests"):
        cost.decode_steps_s(np.full(8, 600), 2)  # 4,800 and 4,808 KV tokens, past 4,096
    assert cost.out_of_range_count() == 2


def test_an_out_of_range_warning_names_the_model_and_the_case(cost_file: Path) -> None:
    with pytest.warns(RuntimeWarning, match=r"^cost model m\.yaml: tokens = 513 is outside the fitted range"):
        build(cost_file).iteration_time_s(batch([513], [513]))
    context = np.full(9, 8000, dtype=np.int64)  # 72,000 KV tokens; DistServe's capacity is 66,144
    with pytest.warns(RuntimeWarning, match=r"^cost model profiler-a100-80g\.vllm\.json\[facebook/opt-13b, tp=1\]: "
                                            r"a batch reading 72000 KV tokens is outside the fitted range"):
        distserve().iteration_time_s(Batch(np.ones(9, dtype=np.int64), context))


def test_a_fitted_model_that_prices_no_time_is_refused_where_it_does(tmp_path: Path) -> None:
    """A negative intercept: the run went on with negative iterations (finish before
    arrival, e2e p50 of -23 s); NaN stopped the engine with an AssertionError."""
    path = tmp_path / "neg.yaml"
    for const, shown in ((-1.0, "-1"), (0.0, "0"), (float("nan"), "nan")):
        coef = dict(zip(term_names([]), [const, 0.0, 0.0, 0.0, 0.0], strict=True))
        path.write_text(yaml.safe_dump({"format": FORMAT, "coefficients_s": coef, "range": {}}))
        if const != const:  # NaN is refused as it is read
            with pytest.raises(ScenarioError, match="coefficients_s.const"):
                build(path)
            continue
        cost = build(path)
        with pytest.raises(ScenarioError, match=rf"^neg\.yaml: priced a batch of 1 requests at "
                                                rf"{shown} s; expected >= 1e-09 s"):
            cost.iteration_time_s(batch([1], [10]))
        # A decode step's batch, named as reference mode's `iteration_time_s` names it.
        with pytest.raises(ScenarioError, match=rf"^neg\.yaml: priced a batch of 2 requests at "
                                                rf"{shown} s"):
            cost.decode_steps_s(np.array([10, 20]), 3)


def test_a_distserve_profile_that_prices_no_time_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    entry = {"prefill": [-50.0, 0.0, 0.0], "decoding_smallbs": [-5.0, 0.0, 0.0],
             "decoding_largebs": [-5.0, 0.0, 0.0], "decoding_large_small_bs_threshold": 8}
    path.write_text(json.dumps({"opt-13b": {"1": entry}}))
    cost = build(path, model="opt-13b", tensor_parallel=1)
    with pytest.raises(ScenarioError, match=r"^p\.json\[opt-13b, tp=1\]: priced a batch of 1 "
                                            r"requests at -0\.05 s"):
        cost.iteration_time_s(batch([4], [4]))
    with pytest.raises(ScenarioError, match=r"priced a batch of 1 requests at -0\.005 s"):
        cost.decode_steps_s(np.array([10]), 2)


def test_a_run_on_a_model_that_prices_no_time_stops_with_one_line(tmp_path: Path) -> None:
    from orcasim.run import run_scenario
    from tests.conftest import make_scenario

    path = tmp_path / "neg.yaml"
    coef = dict(zip(term_names([]), [-1.0, 0.0, 0.0, 0.0, 0.0], strict=True))
    path.write_text(yaml.safe_dump({"format": FORMAT, "coefficients_s": coef, "range": {}}))
    for mode in ("fast", "reference"):
        with pytest.raises(ScenarioError, match=r"neg\.yaml: priced a"):
            run_scenario(make_scenario(**{"cost": {"kind": "fitted", "path": str(path)},
                                          "engine.mode": mode}))


def test_a_launch_floor_lifts_a_fit_above_zero_and_host_work_does_not(tmp_path: Path) -> None:
    """The check is on the GPU part the engine runs, max(fit, launch floor): an intercept of
    -0.1 ms under a floor of 10 layers x 0.1 ms is 1 ms (it was refused inside the fit,
    before the floor). Host work added after it lifts nothing: with a host's 1 ms and no
    floor, the negative fit ran at the host's time, unnoticed."""
    from orcasim.cost import build_cost_model
    from orcasim.cost.overhead import OverheadConfig, OverheadCost

    path = tmp_path / "neg.yaml"
    coef = dict(zip(term_names([]), [-1e-4, 0.0, 0.0, 1e-9, 0.0], strict=True))
    path.write_text(yaml.safe_dump({"format": FORMAT, "coefficients_s": coef, "range": {}}))
    bare = build(path)
    checked, bare.checked_source = bare.checked_source, None  # as build_cost_model hands it over
    floor = OverheadConfig(per_iteration_s=1e-3, per_sequence_s=0.0,
                           tensor_parallel_per_iteration_s=0.0, launch_per_layer_s=1e-4)
    cost = OverheadCost(bare, floor, 10, 1, checked_source=checked)
    assert cost.iteration_time_s(batch([1], [10])) == pytest.approx(2e-3)
    assert cost.decode_steps_s(np.array([10, 20]), 3).tolist() == pytest.approx([2e-3] * 3)
    host_only = {"per_iteration_s": 1e-3, "per_sequence_s": 0.0, "tensor_parallel_per_iteration_s": 0.0}
    lifted = build_cost_model(FittedCostConfig(kind="fitted", path=str(path), overhead=host_only))
    with pytest.raises(ScenarioError, match=r"^neg\.yaml: priced a batch of 1 requests at 0 s"):
        lifted.iteration_time_s(batch([1], [10]))
    with pytest.raises(ScenarioError, match=r"^neg\.yaml: priced a batch of 2 requests at 0 s"):
        lifted.decode_steps_s(np.array([10, 20]), 3)


def test_committed_h200_model_prices_its_own_profile_as_its_quality_says() -> None:
    """The profile and fit calibrate/gpu_check.sh made on a lent H200 (2026-12-04): the fit
    prices every profiled shape in range, and its median relative error over them is the
    held-out one it records (in-sample is no worse than held-out, within noise)."""
    path = ROOT / "calibrate" / "cost_models" / "gpu-h200-gpt3-13b.yaml"
    recorded = yaml.safe_load(path.read_text())
    assert recorded["provenance"]["device_name"] == "NVIDIA H200"
    assert recorded["provenance"]["model"] == "gpt3-13b"
    profile = pd.read_csv(ROOT / "calibrate" / "profiles" / "gpu-h200-gpt3-13b.csv", comment="#")
    cost = build(path)
    priced = np.array([cost.iteration_time_s(batch(list(map(int, q.split())), list(map(int, c.split()))))
                       for q, c in zip(profile["query_tokens"], profile["context_tokens"], strict=True)])
    assert cost.out_of_range_count() == 0
    error = np.abs(priced / profile["time_s"].to_numpy() - 1.0)
    assert np.median(error) <= recorded["quality"]["median_rel_error"] * 1.1


@pytest.mark.parametrize("key, value, message", [
    ("coefficients_s", {**COEF, "const": True}, "coefficients_s.const = true: expected a number, "
                                                "not a boolean"),
    ("knots_tokens", [True], "knots_tokens = [True]: expected a number, not a boolean"),
    ("range", {**RANGE, "tokens": [False, 512]}, "range.tokens = [false, 512]: expected a number"),
])
def test_a_boolean_in_a_fitted_file_is_refused(tmp_path: Path, key: str, value: object,
                                               message: str) -> None:
    """pydantic read `const: true` as 1: every iteration cost 1 s more, without a word (a
    tester's finding)."""
    path = tmp_path / "b.yaml"
    doc = {"format": FORMAT, "knots_tokens": KNOTS, "coefficients_s": COEF, "range": RANGE,
           key: value}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError, match=re.escape(message)):
        build(path)


def test_a_boolean_in_a_distserve_profile_is_refused(tmp_path: Path) -> None:
    """JSON's true read as 1: a prefill constant of 22 ms priced at 1 ms, without a word."""
    doc = json.loads((ROOT / "orcasim" / "data" / DISTSERVE).read_text())
    doc["facebook/opt-13b"]["1"]["prefill"][0] = True
    path = tmp_path / "p.vllm.json"
    path.write_text(json.dumps(doc))
    (tmp_path / "max_num_tokens.csv").write_text(
        (ROOT / "orcasim" / "data" / DISTSERVE).with_name("max_num_tokens.csv").read_text())
    with pytest.raises(ScenarioError, match=r"prefill = \[true, .*expected a number, not a boolean"):
        build(path, model="opt-13b", tensor_parallel=1)
