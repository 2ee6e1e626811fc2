"""Scenario validation: typos are named with a suggestion; bad values name key, value, expectation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orcasim.config import ScenarioError
from orcasim.scenario import apply_override, load_scenario, parse_dotted, scenario_from_dict
from orcasim.workload import generate_requests


def test_quickstart_loads() -> None:
    sc = load_scenario("scenarios/quickstart.yaml")
    assert sc.name == "quickstart" and [s.name for s in sc.systems] == ["request-level", "orca"]


@pytest.mark.parametrize("path,value,message", [
    ("workload.arival", {"kind": "poisson"}, "unknown key 'arival'; did you mean 'arrival'"),
    ("systems[1].scheduler.max_batch_sze", 3, "did you mean 'max_batch_size'"),
    ("kv_capacity", 5, "did you mean 'kv_capacity_tokens'"),
    ("workload.arrival.rate_per_s", -1, "workload.arrival.rate_per_s = -1: Input should be greater than 0"),
    ("workload.prompt_tokens", {"kind": "uniform", "low": 9, "high": 3}, "low (9) must be <= high (3)"),
    ("workload.arrival.kind", "weibull", "workload.arrival.kind = 'weibull': expected one of "
                                         "'poisson', 'gamma'"),
    ("workload.arrival.kind", "poison", "workload.arrival.kind = 'poison': expected one of "
                                        ".*; did you mean 'poisson'?"),
    ("workload.arrival", {"rate_per_s": 2}, "workload.arrival.kind: Field required"),
    ("cost.base_s", "fast", "cost.base_s = 'fast'"),
    ("systems[1].name", "request-level", "name = 'request-level': expected a name no other "
                                         "system has"),
    # Each name is a folder: on macOS or Windows the two were one, its frames the second's.
    ("systems[1].name", "Request-Level", "name = 'Request-Level': expected a name no other "
                                         "system has, in any case"),
    ("workload.max_tokens", 5000, "exceeds kv_capacity_tokens"),
])
def test_bad_values_are_named(base_dict: dict[str, Any], path: str, value: Any, message: str) -> None:
    apply_override(base_dict, f"{path}={value!r}" if isinstance(value, str) else f"{path}={value}")
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scenario_from_dict(base_dict)


def test_max_tokens_below_a_request_is_rejected(base_dict: dict[str, Any]) -> None:
    import numpy as np

    base_dict["workload"]["max_tokens"] = 50
    sc = scenario_from_dict(base_dict)
    with pytest.raises(ValueError, match="workload.max_tokens = 50 is below request"):
        generate_requests(sc.workload, np.random.default_rng(0))


def test_trace_workload_needs_no_lengths_and_rejects_them(base_dict: dict[str, Any]) -> None:
    base_dict["workload"]["arrival"] = {"kind": "trace", "path": "x.csv"}
    with pytest.raises(ScenarioError, match="must not be set: a trace supplies the lengths"):
        scenario_from_dict(base_dict)
    for key in ("prompt_tokens", "output_tokens", "num_requests"):
        del base_dict["workload"][key]
    assert scenario_from_dict(base_dict).workload.num_requests is None


def test_generated_workload_needs_lengths(base_dict: dict[str, Any]) -> None:
    del base_dict["workload"]["prompt_tokens"]
    with pytest.raises(ScenarioError, match="missing prompt_tokens"):
        scenario_from_dict(base_dict)


def test_malformed_yaml_names_the_line(tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\nworkload: [1, 2\n")
    with pytest.raises(ScenarioError, match="malformed YAML"):
        load_scenario(f)


def test_a_key_given_twice_is_an_error_naming_it(tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "twice.yaml"
    f.write_text("name: x\nworkload:\n  arrival: {kind: poisson, rate_per_s: 2, rate_per_s: 4}\n")
    with pytest.raises(ScenarioError, match="line 3 .*'rate_per_s' given twice"):
        load_scenario(f)
    merged = tmp_path / "merged.yaml"  # a `<<` merge's keys may be overridden: not duplicates
    merged.write_text("a: &x {p: 1}\nb: {<<: *x, p: 2}\n")
    from orcasim import yaml_strict

    assert yaml_strict.load(merged.read_text()) == {"a": {"p": 1}, "b": {"p": 2}}


def test_an_override_changes_one_system_of_a_shared_anchor(tmp_path) -> None:  # noqa: ANN001
    """`scheduler: *s` shares no object with its anchor: a --set at one system (or a sweep
    file's `set:`) changed every system that used the anchor (a tester's finding)."""
    f = tmp_path / "shared.yaml"
    f.write_text(
        "name: shared\n"
        "workload: {num_requests: 10, arrival: {kind: poisson, rate_per_s: 2},\n"
        "  prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant, value: 4},\n"
        "  max_tokens: 64}\n"
        "cost: {kind: linear, base_s: 0.01, per_token_s: 0.001}\nkv_capacity_tokens: 1000\n"
        "systems:\n"
        "  - {name: a, scheduler: &s {kind: iteration_level, max_batch_size: 8}}\n"
        "  - {name: b, scheduler: *s}\n")
    sc = load_scenario(f, ["systems[0].scheduler.max_batch_size=1"])
    assert [s.scheduler.max_batch_size for s in sc.systems] == [1, 8]


def test_unreadable_keys_and_recursive_anchors_are_malformed_yaml(tmp_path) -> None:  # noqa: ANN001
    """A list or mapping as a key, and an anchor inside its own value, are bad input (exit 2
    at the CLI), not a TypeError or a RecursionError."""
    for text, problem in (("? [1, 2]\n: 3\n", "found a list as a key"),
                          ("name: x\nworkload: &w {n: *w}\n", "alias of that anchor")):
        f = tmp_path / "bad.yaml"
        f.write_text(text)
        with pytest.raises(ScenarioError, match=f"malformed YAML .*{problem}"):
            load_scenario(f)
    with pytest.raises(ScenarioError, match="is not valid YAML"):
        apply_override({}, "workload={[1]: 2}")


def test_numbers_in_exponent_form_are_numbers() -> None:
    """YAML 1.2's floats: PyYAML (1.1) kept 5e-1 and 1e0 as strings, so a sweep grid of
    rates sorted as text ('1.0e1' < '1e0' < '4e0' < '5e-1')."""
    from orcasim import yaml_strict

    assert yaml_strict.load("r: [5e-1, 1e0, 4e0, 1.0e1, -2E+3, .5e2, 3, '1e3', 1e]") == {
        "r": [0.5, 1.0, 4.0, 10.0, -2000.0, 50.0, 3, "1e3", "1e"]}


def test_integers_are_decimal_and_base_60_is_text(tmp_path) -> None:  # noqa: ANN001
    """YAML 1.1 read `kv_capacity_tokens: 0100000` as octal (32,768, silently) and
    `warmup_s: 1:30` as 90 (a tester's finding); YAML 1.2 reads decimal, and `0x`/`0o`."""
    from orcasim import yaml_strict

    assert yaml_strict.load("n: [0100000, 0800, 0x10, 0o17, 1_000, -3, +4, 0, 3., .5, .inf, -.nan]")[
        "n"][:9] == [100000, 800, 16, 15, 1000, -3, 4, 0, 3.0]
    assert yaml_strict.load("t: [1:30, 1:30.5, 0b101, ., 0x_, 1.2.3]") == {
        "t": ["1:30", "1:30.5", "0b101", ".", "0x_", "1.2.3"]}
    f = tmp_path / "octal.yaml"
    f.write_text("name: octal\nworkload: {num_requests: 10, arrival: {kind: poisson, rate_per_s: 2},"
                 "\n  prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant,"
                 " value: 4},\n  max_tokens: 64}\ncost: {kind: linear, base_s: 0.01}\n"
                 "kv_capacity_tokens: 0100000\nsystems: [{name: a, scheduler: {kind: paged}}]\n")
    assert load_scenario(f).kv_capacity_tokens == 100000
    assert load_scenario(f, ["kv_capacity_tokens=0100000"]).kv_capacity_tokens == 100000
    with pytest.raises(ScenarioError, match="warmup_s = '1:30'"):
        load_scenario(f, ["warmup_s=1:30"])


def test_dates_are_text_as_yaml_1_2_reads_them(tmp_path) -> None:  # noqa: ANN001
    """YAML 1.1 read `name: 2024-06-01` as a date, refused as 'name = datetime.date(2024, 6,
    1): Input should be a valid string' (a tester's finding); YAML 1.2 has no timestamps."""
    from orcasim import yaml_strict

    assert yaml_strict.load("d: [2024-06-01, 2001-12-14t21:59:43.10-05:00, '2024-06-01']") == {
        "d": ["2024-06-01", "2001-12-14t21:59:43.10-05:00", "2024-06-01"]}
    f = tmp_path / "dated.yaml"
    f.write_text("name: 2024-06-01\nworkload: {num_requests: 10, arrival: {kind: poisson, "
                 "rate_per_s: 2},\n  prompt_tokens: {kind: constant, value: 8}, output_tokens: "
                 "{kind: constant, value: 4},\n  max_tokens: 64}\ncost: {kind: linear, base_s: "
                 "0.01}\nkv_capacity_tokens: 1024\nsystems: [{name: 2024-06-02, scheduler: "
                 "{kind: paged}}]\n")
    assert load_scenario(f).systems[0].name == "2024-06-02"
    with pytest.raises(ScenarioError, match="seed = '2024-06-01': Input should be a valid integer"):
        load_scenario(f, ["seed=2024-06-01"])


def test_overrides_parse_yaml_values(base_dict: dict[str, Any]) -> None:
    apply_override(base_dict, "systems[1].scheduler.max_batch_size=16")
    apply_override(base_dict, "workload.arrival.rate_per_s=2.5")
    sc = scenario_from_dict(base_dict)
    assert sc.systems[1].scheduler.max_batch_size == 16
    assert sc.workload.arrival.rate_per_s == 2.5
    assert parse_dotted("a.b[2].c") == ["a", "b", 2, "c"]
    # Read as a scenario file's values are (orcasim.yaml_strict), not as YAML 1.1's strings.
    apply_override(base_dict, "sweep={parameter: seed, values: [5e-1, 1e0]}")
    assert base_dict["sweep"]["values"] == [0.5, 1.0]
    with pytest.raises(ScenarioError, match="is not valid YAML"):
        apply_override(base_dict, "cost={kind: linear, kind: roofline}")
    with pytest.raises(ScenarioError, match="expected KEY=VALUE"):
        apply_override(base_dict, "workload.max_tokens")
    with pytest.raises(ScenarioError, match=r"index \[5\] does not exist"):
        apply_override(base_dict, "systems[5].name=x")


def test_scenario_is_frozen(base_dict: dict[str, Any]) -> None:
    sc = scenario_from_dict(base_dict)
    with pytest.raises(Exception, match="frozen"):
        sc.seed = 3  # type: ignore[misc]


def test_a_list_item_named_by_a_dot_is_told_its_brackets(base_dict: dict[str, Any]) -> None:
    # systems.0 is how other tools write it; it read "'0' is not inside a mapping".
    for path, fixed in [("systems.0.scheduler.max_batch_size", r"systems\[0\]\.scheduler\.max_batch_size"),
                        ("systems.1", r"systems\[1\]")]:
        with pytest.raises(ScenarioError, match=rf"names an item of a list; expected an index in "
                                                rf"brackets, e.g. {fixed}$"):
            apply_override(base_dict, f"{path}=3")
    with pytest.raises(ScenarioError, match=r"'x' is not inside a mapping$"):
        apply_override(base_dict, "systems.x=3")


def test_aliases_that_expand_past_a_million_values_are_refused(tmp_path) -> None:  # noqa: ANN001
    """Nine levels of nine aliases (about 1 kB) copied for minutes before any key was
    checked (a fuzzing tester's finding); a file that shares an anchor a few times reads."""
    from orcasim import yaml_strict

    lines = ["x0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 9) + "]" for i in range(1, 9)]
    with pytest.raises(yaml_strict.AliasBombError):
        yaml_strict.load("\n".join(lines))
    assert len(yaml_strict.load("\n".join(lines[:4]))["x3"]) == 9
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines))
    with pytest.raises(ScenarioError, match="aliases expand to more than a million values"):
        load_scenario(f)


def _derived(tmp_path) -> Any:  # noqa: ANN001
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nworkload:\n  num_requests: 4\n  arrival: {kind: poisson, rate_per_s: 1}\n"
                 "  prompt_tokens: {kind: constant, value: 8}\n  output_tokens: {kind: constant, value: 4}\n  max_tokens: 64\n"
                 "model: llama3-8b\nhardware: {gpu: h100-80gb}\ncost: {kind: roofline}\n"
                 "systems: [{name: a, scheduler: {kind: paged}}]\n")
    return load_scenario(f)


def test_a_saved_scenario_rerun_on_another_gpu_derives_its_own_kv_capacity(tmp_path) -> None:  # noqa: ANN001
    """The saved scenario.yaml wrote a derived KV capacity as if given: rerun with another
    GPU (or a model that does not fit) it ran with the first GPU's 453,130 tokens (a tester's
    finding). It now says the figure in a comment and leaves it out."""
    from orcasim.scenario import scenario_to_yaml

    scenario = _derived(tmp_path)
    saved = tmp_path / "saved.yaml"
    saved.write_text(scenario_to_yaml(scenario))
    assert saved.read_text().startswith(f"# kv_capacity_tokens: {scenario.kv_capacity_tokens} here")
    assert load_scenario(saved).kv_capacity_tokens == scenario.kv_capacity_tokens
    smaller = load_scenario(saved, ["hardware.gpu=a100-40gb"])
    assert smaller.kv_capacity_derived
    assert smaller.kv_capacity_tokens == load_scenario(tmp_path / "s.yaml", ["hardware.gpu=a100-40gb"]).kv_capacity_tokens
    assert smaller.kv_capacity_tokens < scenario.kv_capacity_tokens / 2
    with pytest.raises(ScenarioError, match="llama2-70b"):
        load_scenario(saved, ["model=llama2-70b"])


def test_a_loaded_scenario_run_with_a_hardware_override_derives_its_own_kv_capacity(tmp_path) -> None:  # noqa: ANN001
    from orcasim.run import run_scenario

    scenario = _derived(tmp_path)
    result = run_scenario(scenario, ["hardware.gpu=a100-40gb"])
    assert result.scenario.kv_capacity_tokens == load_scenario(
        tmp_path / "s.yaml", ["hardware.gpu=a100-40gb"]).kv_capacity_tokens


def test_a_kv_capacity_beyond_what_the_gpus_hold_warns() -> None:
    """OPT-13B on one A100-40GB (39.5 GiB, 23.9 GiB of weights) with kv_capacity_tokens
    2,000,000 (1.6 TB of KV) ran without a word: Orca reserved 85.6 GB of KV on the 42 GB
    GPU (a tester's finding). A capacity beyond the whole memory less the weights warns; one
    within it (another utilisation or reserve than the catalog's) says nothing."""
    import warnings

    memory = "scenarios/memory/opt13b_a100_sharegpt.yaml"
    with pytest.warns(UserWarning, match=r"^kv_capacity_tokens = 2000000 is beyond what the "
                                         r"deployment holds: .* at most 20,389 tokens"):
        load_scenario(memory, ["kv_capacity_tokens=2000000"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # (its activation_reserve_gib: 0 is not used beside the tokens given: said, not this)
        warnings.filterwarnings("ignore", "hardware.activation_reserve_gib = 0 is not used")
        load_scenario(memory, ["kv_capacity_tokens=20000"])  # above the derived 15,212: fine
        load_scenario("scenarios/validation/vllm_opt13b_a100.yaml")  # DistServe's 66,144


def test_a_fleet_groups_own_kv_capacity_beyond_its_gpus_warns(tmp_path: Path) -> None:
    """A fleet's group's kv_capacity_tokens runs as given beside the scenario's (or its own)
    model and hardware, as the scenario's does: 2,000,000 tokens of OPT-13B on one
    A100-40GB said nothing there while the same at the top level warned. Named by its key."""
    import warnings

    (tmp_path / "f.yaml").write_text(
        "name: f\nworkload: {num_requests: 4, arrival: {kind: poisson, rate_per_s: 1.0},\n"
        "  prompt_tokens: {kind: constant, value: 100}, output_tokens: {kind: constant, value: 10},\n"
        "  max_tokens: 2048}\nmodel: opt-13b\nhardware: {gpu: a100-40gb}\ncost: {kind: roofline}\n"
        "systems:\n  - name: fleet\n    scheduler: {kind: paged}\n    cluster:\n"
        "      router: {kind: round_robin}\n      replicas:\n"
        "        - {count: 1, kv_capacity_tokens: 2000000}\n"
        "        - {count: 1, hardware: {gpu: a100-80gb}, kv_capacity_tokens: 20000}\n")
    with pytest.warns(UserWarning, match=r"^systems\[0\]\.cluster\.replicas\[0\]\.kv_capacity_tokens "
                                         r"= 2000000 is beyond what the deployment holds: .* at "
                                         r"most 20,389 tokens") as caught:
        load_scenario(tmp_path / "f.yaml")
    assert len([w for w in caught if "beyond" in str(w.message)]) == 1  # the A100-80GB's fits
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_scenario(tmp_path / "f.yaml", ["systems[0].cluster.replicas[0].kv_capacity_tokens=20000"])


def test_a_prefill_pools_own_kv_capacity_beyond_its_gpus_warns() -> None:
    """A disaggregated cluster's prefill pool holds its prompts' KV in its own tokens too:
    checked against its own hardware (two A100-80GBs here, DistServe's 163,008 within)."""
    import warnings

    disagg = "scenarios/cluster/disagg_vs_colocated.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_scenario(disagg)
    with pytest.warns(UserWarning, match=r"^systems\[1\]\.cluster\.prefill\.kv_capacity_tokens = "
                                         r"900000 is beyond .* 2 x a100-80gb"):
        load_scenario(disagg, ["systems[1].cluster.prefill.kv_capacity_tokens=900000"])


def test_a_memory_share_beside_a_given_kv_capacity_warns_that_it_is_not_used() -> None:
    """`gpu_memory_utilization` and `activation_reserve_gib` only derive a KV capacity: beside
    a `kv_capacity_tokens` given (or without a model to derive one) they changed nothing, and
    a sweep of gpu_memory_utilization [0.5, 0.9] over a scenario that gave 40,000 tokens
    wrote two identical rows without a word (a tester's finding). Said by the key; the
    default value, which a saved scenario writes out, says nothing."""
    import warnings

    base = "scenarios/validation/vllm_opt13b_a100.yaml"  # kv_capacity_tokens 66,144 given
    with pytest.warns(UserWarning, match=r"^hardware\.gpu_memory_utilization = 0\.5 is not used: it "
                                         r"only derives a KV capacity, and kv_capacity_tokens = "
                                         r"66144 is given"):
        load_scenario(base, ["hardware.gpu_memory_utilization=0.5"])
    with pytest.warns(UserWarning, match=r"^hardware\.activation_reserve_gib = 4 is not used: .*, "
                                         r"which needs a model"):
        load_scenario("scenarios/quickstart.yaml", ["hardware={gpu: a100-80gb, "
                                                    "activation_reserve_gib: 4}"])
    group = ("systems[0].cluster={replicas: [{count: 1, kv_capacity_tokens: 4096, hardware: "
             "{gpu: a100-80gb, gpu_memory_utilization: 0.5}}]}")
    with pytest.warns(UserWarning, match=r"^systems\[0\]\.cluster\.replicas\[0\]\.hardware\."
                                         r"gpu_memory_utilization = 0\.5 is not used: .*, and "
                                         r"systems\[0\]\.cluster\.replicas\[0\]\.kv_capacity_tokens"):
        load_scenario(base, [group])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_scenario(base, ["hardware.gpu_memory_utilization=0.9"])  # the default: a dump's
        load_scenario(base, ["kv_capacity_tokens=null", "hardware.gpu_memory_utilization=0.5"])


def test_a_set_kind_that_keeps_a_key_of_the_old_kind_says_so(tmp_path: Path) -> None:
    """`--set systems[0].scheduler.kind=iteration_level` on a paged scheduler with
    `max_num_seqs` read 'unknown key max_num_seqs for kind iteration_level ...; did you mean
    max_batch_size?': adding max_batch_size does not help, since --set cannot drop a key. It
    names the old kind and the way that works, setting the whole block."""
    path = tmp_path / "paged.yaml"
    path.write_text("name: p\nworkload: {num_requests: 5, arrival: {kind: poisson, rate_per_s: 1}, "
                    "prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant, "
                    "value: 4}, max_tokens: 12}\ncost: {kind: linear, base_s: 0.01}\nkv_capacity_tokens: 1000\n"
                    "systems: [{name: a, scheduler: {kind: paged, max_num_seqs: 8}}]\n")
    item = "systems[0].scheduler.kind=iteration_level"
    with pytest.raises(ScenarioError, match=(
            rf"^{path} with --set systems\[0\].scheduler.kind=iteration_level: systems\[0\]"
            r".scheduler: max_num_seqs = 8 \(given for kind 'paged'\) is no key of kind "
            r"'iteration_level', and changing the kind keeps them; to change a block's kind, set "
            r"the whole block, e.g. --set 'systems\[0\].scheduler=\{kind: iteration_level, ...\}'$")):
        load_scenario(path, [item])
    whole = "systems[0].scheduler={kind: iteration_level, max_batch_size: 8}"
    assert load_scenario(path, [item, whole]).systems[0].scheduler.kind == "iteration_level"
    assert load_scenario(path, ["systems[0].scheduler.kind=chunked"]).systems[0].scheduler.kind == "chunked"


def test_a_kind_set_after_a_key_of_an_inherited_block_says_so(tmp_path: Path) -> None:
    """A key set first into a group's scheduler copies its system's (`_seed_inherited`):
    `...replicas[0].scheduler.max_batch_size=4` then `...scheduler.kind=iteration_level` kept
    the system's paged max_num_seqs and read pydantic's 'unknown key max_num_seqs ...; did
    you mean max_batch_size?', the key just given, as the old kind's was only looked for in
    the file. Now the kind-change line, whose whole-block advice works; the other order runs."""
    path = tmp_path / "fleet.yaml"
    path.write_text("name: p\nworkload: {num_requests: 5, arrival: {kind: poisson, rate_per_s: 1}, "
                    "prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant, "
                    "value: 4}, max_tokens: 12}\ncost: {kind: linear, base_s: 0.01}\nkv_capacity_tokens: 1000\n"
                    "systems: [{name: a, scheduler: {kind: paged, max_num_seqs: 8}, "
                    "cluster: {replicas: [{count: 1}, {count: 1}]}}]\n")
    group = "systems[0].cluster.replicas[0].scheduler"
    key, kind = f"{group}.max_batch_size=4", f"{group}.kind=iteration_level"
    with pytest.raises(ScenarioError, match=(
            r"replicas\[0\]\.scheduler: max_num_seqs = 8 \(given for kind 'paged'\) is no key of "
            r"kind 'iteration_level', and changing the kind keeps them; to change a block's kind, "
            r"set the whole block")):
        load_scenario(path, [key, kind])
    for items in ([kind, key], [f"{group}={{kind: iteration_level, max_batch_size: 4}}"]):
        assert load_scenario(path, items).systems[0].cluster.replicas[0].scheduler.kind == "iteration_level"
