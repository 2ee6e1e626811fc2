"""The sweep file: grids, replication seeds, and errors caught before any work starts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from sweep_files import write_grid_4x3, write_sweep

from orcasim.config import ScenarioError
from orcasim.sweeps import load_sweep, make_sweep
from orcasim.sweeps.spec import point_name


def test_product_grid_has_every_combination(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    sweep = load_sweep(grid_4x3)
    points = sweep.points()
    assert len(points) == 12
    assert points[0] == {"workload.arrival.rate_per_s": 1.0, "systems[1].scheduler.max_batch_size": 2}
    assert points[-1] == {"workload.arrival.rate_per_s": 8.0, "systems[1].scheduler.max_batch_size": 8}


def test_zip_grid_pairs_values(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, """
mode: zip
parameters:
  workload.arrival.rate_per_s: [1.0, 2.0]
  systems[0].scheduler.max_batch_size: [3, 5]
""", replications=3)
    sweep = load_sweep(path)
    assert sweep.points() == [
        {"workload.arrival.rate_per_s": 1.0, "systems[0].scheduler.max_batch_size": 3},
        {"workload.arrival.rate_per_s": 2.0, "systems[0].scheduler.max_batch_size": 5},
    ]
    assert [t.id for t in sweep.tasks()] == [f"p{p:04d}-r{r:02d}" for p in range(2) for r in range(3)]


def test_task_scenario_applies_parameters_and_seed(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    task = load_sweep(grid_4x3).tasks()[5]
    sc = task.scenario()
    assert sc.workload.arrival.rate_per_s == task.params["workload.arrival.rate_per_s"]
    assert sc.systems[1].scheduler.max_batch_size == task.params["systems[1].scheduler.max_batch_size"]
    assert sc.systems[0].scheduler.max_batch_size == 4  # untouched
    assert sc.seed == task.seed


def test_replication_seeds_are_distinct_and_shared_across_points(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 2.0]", replications=4)
    sweep = load_sweep(path)
    seeds = sweep.replication_seeds()
    assert len(set(seeds)) == 4
    assert seeds == load_sweep(path).replication_seeds()  # deterministic
    by_point = {}
    for t in sweep.tasks():
        by_point.setdefault(t.point, []).append(t.seed)
    assert by_point[0] == by_point[1] == seeds  # common random numbers


@pytest.mark.parametrize(("grid", "message"), [
    ("parameters:\n  workload.arival.rate_per_s: [1.0]", "arival"),
    ("parameters:\n  seed: [1, 2]", "replications"),
    ("mode: zip\nparameters:\n  workload.arrival.rate_per_s: [1.0, 2.0]\n  seed_x: [1]", "one length"),
    ("parameters:\n  systems[7].scheduler.max_batch_size: [1]", "[7]"),
    ("parameters:\n  workload.arrival.rate_per_s: []", "at least one value"),
    # A bad value at a later point fails here too, not as failed points of the run.
    ("parameters:\n  workload.arrival.rate_per_s: [1.0, -4.0]", "rate_per_s = -4.0"),
    # One table column per parameter: a traceback from Parquet after every point had run.
    ("parameters:\n  systems[1].scheduler.max_batch_size: [4, '8']",
     "parameters.systems[1].scheduler.max_batch_size = [4, '8']: mixes number and text values"),
    ("parameters:\n  systems[1].scheduler.max_batch_size: [4, true]", "mixes boolean and number"),
    # An integer Parquet cannot hold: a traceback after every point had run (a tester's).
    ("parameters:\n  kv_capacity_tokens: [100000, 100000000000000000000]",
     "parameters.kv_capacity_tokens = 100000000000000000000: beyond a 64-bit integer"),
    # A value listed twice ran its point twice, and `compare` merged the two as one point.
    ("parameters:\n  workload.arrival.rate_per_s: [1.0, 2.0, 1]",
     "parameters.workload.arrival.rate_per_s = [1.0, 2.0, 1]: lists 1.0 twice; expected distinct "
     "values (`replications` repeats a point with independent seeds)"),
    ("mode: zip\nparameters:\n  workload.arrival.rate_per_s: [1.0, 1.0]\n  warmup_s: [0, 0]",
     "mode = zip: point 1 (workload.arrival.rate_per_s = 1.0, warmup_s = 0) repeats point 0; "
     "expected distinct points"),
    # Said once: the int and the float form each refused it (a NaN is not equal to itself).
    ("parameters:\n  workload.arrival.rate_per_s: [.nan]",
     "tiny_sweep.yaml: grid.parameters.workload.arrival.rate_per_s[0] = nan: Input should be a "
     "finite number"),
])
def test_bad_sweeps_fail_with_one_line(tmp_path: Path, grid: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_sweep(write_sweep(tmp_path, grid))
    assert message in str(err.value) and (len(message) < 40 or str(err.value).count(message) == 1)
    assert "\n" not in str(err.value)


def test_numbers_of_both_kinds_share_a_column_and_a_set_seed_is_refused(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1, 2.5]"))
    assert [p["workload.arrival.rate_per_s"] for p in sweep.points()] == [1, 2.5]
    path = write_sweep(tmp_path, "parameters:\n  warmup_s: [0]")
    path.write_text(path.read_text().replace("seed: 5\n", "seed: 5\nset: [seed=9]\n"))
    with pytest.raises(ScenarioError, match=r"^set: 'seed=9': a sweep's seeds come from its own "):
        load_sweep(path)
    # Given on the command line, it is named as such (it read 'set:').
    with pytest.raises(ScenarioError, match=r"^--set 'seed=4': a sweep's seeds come from its own "):
        load_sweep(write_sweep(tmp_path, "parameters:\n  warmup_s: [0]"), ["seed=4"])


def test_a_base_scenarios_own_sweep_left_out_of_the_grid_is_named(tmp_path: Path) -> None:
    """The grid replaces it: silent, its points went missing. Swept again in the grid, it is
    replaced on purpose (the shipped Orca sweep does so) and nothing is said."""
    import warnings

    import yaml

    spec = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 2.0]")
    base = tmp_path / "tiny.yaml"
    data = yaml.safe_load(base.read_text())
    base.write_text(yaml.safe_dump({**data, "sweep": {"parameter": "warmup_s", "values": [0, 1]}}))
    with pytest.warns(UserWarning, match=r"^tiny\.yaml's own sweep over warmup_s is not run"):
        load_sweep(spec)
    base.write_text(yaml.safe_dump({**data, "sweep": {"parameter": "workload.arrival.rate_per_s",
                                                      "values": [3.0]}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_sweep(spec)


def test_a_base_s_own_sweep_that_the_set_leaves_invalid_is_not_built(tmp_path: Path) -> None:
    """The grid replaces the base's own sweep, which never runs, so its points are not
    built: a `set:` that changes the kind of a scheduler whose key it sweeps loads (a
    reviewer's finding: the loader's check of every own point, ab14eb0, refused this sweep
    with "sweep.values[0] = 4: systems[1].scheduler: unknown key 'max_batch_size' for kind
    'paged'", where it ran before). Loaded alone, the same base and set are refused."""
    import yaml

    from orcasim.scenario import load_scenario

    spec = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 2.0]")
    paged = "systems[1].scheduler={kind: paged, max_num_seqs: 4, max_num_batched_tokens: 2048}"
    spec.write_text(spec.read_text().replace("seed: 5\n", f"seed: 5\nset: ['{paged}']\n"))
    base = tmp_path / "tiny.yaml"
    data = yaml.safe_load(base.read_text())
    base.write_text(yaml.safe_dump({**data, "sweep": {
        "parameter": "systems[1].scheduler.max_batch_size", "values": [4, 8]}}))
    with pytest.warns(UserWarning, match="own sweep over systems"):
        sweep = load_sweep(spec)
    assert [t.scenario().systems[1].scheduler.kind for t in sweep.tasks()] == ["paged", "paged"]
    with pytest.raises(ScenarioError, match=r"sweep.values\[0\] = 4: systems\[1\].scheduler: "
                                            "unknown key 'max_batch_size' for kind 'paged'"):
        load_scenario(base, [paged])


def test_replications_are_bounded(tmp_path: Path) -> None:
    """1e12 replications never finished validating (SeedSequence.spawn)."""
    with pytest.raises(ScenarioError, match="replications = 1000000000000: Input should be "
                                            "less than or equal to 10000"):
        load_sweep(write_sweep(tmp_path, "parameters:\n  warmup_s: [0]", replications=10**12))


@pytest.mark.timeout(10)  # without the bound it builds tasks until memory runs out
def test_grid_size_is_bounded(tmp_path: Path) -> None:
    """Three lists of 1,000 values make 1e9 points: the sweep built every task before
    checking any (4.8 GB in its first minute, on its way to hundreds) where it is refused
    at once now, with its size; a grid at the bound still loads."""
    values = ", ".join(str(v) for v in range(1, 1001))
    grid = "parameters:\n" + "\n".join(
        f"  {key}: [{values}]" for key in ("warmup_s", "workload.max_tokens", "cost.base_s"))
    with pytest.raises(ScenarioError, match=r"grid.parameters make 1000 x 1000 x 1000 = 1e\+09 "
                                            r"points, 2e\+09 tasks with replications = 2, "
                                            r"beyond the 1,000,000"):
        load_sweep(write_sweep(tmp_path, grid, replications=2))
    zipped = write_sweep(tmp_path, "mode: zip\nparameters:\n  warmup_s: [0, 1]", replications=10_000)
    assert len(load_sweep(zipped).tasks()) == 20_000


def test_a_point_may_change_a_kind(tmp_path: Path) -> None:
    """Each point started from the base with every default of its first kind, so a grid over
    a scheduler's or an arrival's `kind` was refused on a key the user never wrote
    (`kv_reservation` for request_level); it starts again from the keys given, as
    `--set systems[1].scheduler.kind=...` on the scenario file does."""
    path = write_sweep(tmp_path, """
mode: zip
parameters:
  systems[1].scheduler.kind: [iteration_level, request_level]
  workload.arrival.kind: [poisson, constant]
""")
    first, second = (task.scenario() for task in load_sweep(path).tasks())
    assert first.systems[1].scheduler.kind == "iteration_level"
    assert first.systems[1].scheduler.max_batch_size == 4 == second.systems[1].scheduler.max_batch_size
    assert second.systems[1].scheduler.kind == "request_level"
    assert second.workload.arrival.kind == "constant" and second.workload.arrival.rate_per_s == 4.0


def test_a_kind_change_keeps_the_keys_swept_before_it(tmp_path: Path) -> None:
    """Parameters applied in grid order: a kind named after a key of its own object reset
    that object and dropped the swept value (the points ran with the base's 4)."""
    path = write_sweep(tmp_path, """
mode: zip
parameters:
  systems[1].scheduler.max_batch_size: [2, 16]
  systems[1].scheduler.kind: [iteration_level, request_level]
""")
    first, second = (task.scenario() for task in load_sweep(path).tasks())
    assert (first.systems[1].scheduler.kind, first.systems[1].scheduler.max_batch_size) == (
        "iteration_level", 2)
    assert (second.systems[1].scheduler.kind, second.systems[1].scheduler.max_batch_size) == (
        "request_level", 16)


def test_a_kind_change_that_keeps_a_key_of_the_old_kind_says_so(tmp_path: Path) -> None:
    """A grid over a kind whose base block gives a key of the old kind only (iteration_level's
    `max_batch_size` under paged, linear's `base_s` under roofline) read 'unknown key
    max_batch_size for kind paged; did you mean max_num_seqs?', as if the user had written
    it for paged; it names the old kind and what to do, since a grid cannot drop a key."""
    path = write_sweep(tmp_path, "parameters:\n  systems[1].scheduler.kind: [iteration_level, paged]")
    with pytest.raises(ScenarioError, match=(
            r"^point p0001-r00 \(systems\[1\].scheduler.kind=paged\): systems\[1\].scheduler: "
            r"max_batch_size = 4 \(given for kind 'iteration_level'\) is no key of kind 'paged', "
            r"and changing the kind keeps them; a grid cannot drop a key: leave it out of the "
            r"base scenario, or compare the kinds as two systems$")):
        load_sweep(path).tasks()[1].scenario()
    costs = write_sweep(tmp_path, "parameters:\n  cost.kind: [linear, roofline]", name="costs")
    with pytest.raises(ScenarioError, match=r"cost: base_s = 0.01, per_token_s = 2e-05, "
                       r"per_context_token_s = 1e-07 \(given for kind 'linear'\) are no keys of "
                       r"kind 'roofline'"):
        load_sweep(costs).tasks()[1].scenario()


def test_a_set_on_a_swept_key_is_refused_not_dropped(tmp_path: Path) -> None:
    """--set workload.arrival.rate_per_s=9 on a sweep over that rate ran the grid's rates
    without a word, and validate said ok (a tester's finding); so did the file's own set:."""
    path = write_grid_4x3(tmp_path)
    with pytest.raises(ScenarioError, match=r"^--set 'workload.arrival.rate_per_s=9': the grid "
                                            r"sets workload.arrival.rate_per_s at every point"):
        load_sweep(path, ["workload.arrival.rate_per_s=9"])
    text = path.read_text().replace("grid:", "set: [workload.arrival.rate_per_s=9]\ngrid:")
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"^set: 'workload.arrival.rate_per_s=9': the grid"):
        load_sweep(path)


def test_a_sweep_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = write_grid_4x3(tmp_path)
    path.write_bytes(b"# d\xe9bit\n" + path.read_bytes())
    with pytest.raises(ScenarioError, match=r"not UTF-8 text \(byte 3\); expected a YAML file$"):
        load_sweep(path)


def test_a_grid_key_that_does_not_reach_is_named_as_the_grids(tmp_path: Path) -> None:
    """A grid path past the base's list read "override 'systems[5]...': index [5] does not
    exist", naming no point, no grid and no length (a tester's finding); a `set:` entry
    without '=' was told the grid sets it."""
    path = write_sweep(tmp_path, "parameters:\n  systems[5].scheduler.max_batch_size: [4]")
    with pytest.raises(ScenarioError) as caught:
        load_sweep(path)
    text = str(caught.value)
    assert "override" not in text
    assert text.startswith("point p0000") and "systems[5].scheduler.max_batch_size: index [5] does " \
        "not exist; expected an index below" in text
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]", name="s2")
    path.write_text(path.read_text() + "set: [workload.max_tokens]\n")
    with pytest.raises(ScenarioError, match=r"set: 'workload.max_tokens': expected KEY=VALUE"):
        load_sweep(path)


def test_a_repeat_is_an_equal_value_of_one_kind() -> None:
    """1 and 1.0 are one point; 1 and True are two kinds, refused as a mix (not as a repeat,
    which named True a repeat of 1)."""
    from orcasim.config import first_repeat

    assert first_repeat([1, 2, 1.0]) == 2
    assert first_repeat([1, True]) is None
    assert first_repeat([(1, "a"), (2, "a"), (1, "a")]) == 2


def test_a_base_that_is_a_sweep_file_is_refused_as_one(tmp_path: Path) -> None:
    """Read as a scenario, another sweep file (or the file itself) as `base` said
    "(top level): unknown key 'base'; did you mean 'seed'?" (a tester's finding)."""
    inner = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]", name="inner")
    outer = tmp_path / "outer.yaml"
    outer.write_text("name: outer\nbase: inner.yaml\ngrid:\n  parameters:\n"
                     "    workload.arrival.rate_per_s: [2.0]\n")
    with pytest.raises(ScenarioError, match=r"outer.yaml: base = 'inner.yaml' is a sweep file "
                                            r"\(it names a base scenario itself\), not a scenario"):
        load_sweep(outer)
    assert load_sweep(inner).points()  # its own base is a scenario
    with pytest.raises(ScenarioError, match=r"base = '.*inner.yaml' is a sweep file"):
        make_sweep(inner, {"workload.arrival.rate_per_s": [2.0]})  # the Python form too


@pytest.mark.parametrize("given", ["replications=3", "grid.mode=zip", "base=other.yaml"])
def test_a_set_of_a_sweep_files_own_key_says_so(tmp_path: Path, given: str) -> None:
    """`--set replications=3` was applied to the base scenario and read "(top level):
    unknown key 'replications'; valid keys are: cost, ..." (a tester's finding)."""
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]")
    top = given.split("=")[0].split(".")[0]
    with pytest.raises(ScenarioError, match=rf"--set '{given}': {top} is a key of the sweep file, "
                                            "not of its base scenario"):
        load_sweep(path, [given])
    assert load_sweep(path, ["name=renamed"]).base["name"] == "renamed"  # a scenario's key too


def test_a_block_in_a_grid_is_refused_naming_the_keys_to_sweep(tmp_path: Path) -> None:
    """A distribution in a grid read 'Input should be a valid integer or ...; expected a
    number of tokens', of a key that takes a block and no number."""
    path = write_sweep(tmp_path, "parameters:\n  workload.output_tokens: [{kind: constant, "
                                 "value: 32}, {kind: constant, value: 64}]")
    with pytest.raises(ScenarioError, match=r"grid.parameters.workload.output_tokens\[0\] = "
                       r"\{'kind': 'constant', 'value': 32\}: expected a single value .* sweep the "
                       r"block's own keys instead, e.g. workload.output_tokens.value"):
        load_sweep(path)


def test_a_null_in_a_grid_reads_as_one_expectation(tmp_path: Path) -> None:
    """pydantic tried each of a grid value's forms, and the unit of a rate went into each:
    'Input should be a valid integer; expected a number per second or a valid number;
    expected a number per second or a valid string or a valid boolean'."""
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [null, 2.0]")
    with pytest.raises(ScenarioError) as err:
        load_sweep(path)
    assert str(err.value).endswith(
        "grid.parameters.workload.arrival.rate_per_s[0] = null: Input should be a valid integer "
        "or a valid number or a valid string or a valid boolean; expected a number per second"
    ), str(err.value)


def test_one_override_alone_is_one_override_in_python(tmp_path: Path) -> None:
    """`load_sweep(path, "workload.num_requests=20")` said "--set 'w': expected KEY=VALUE"
    (its characters read as overrides) and `make_sweep(..., overrides="...")` "set = ...:
    Input should be a valid list", where `run_scenario` takes one alone (found testing the
    Python API as a notebook would)."""
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]")
    loaded = load_sweep(path, "workload.num_requests=20")
    made = make_sweep(tmp_path / "tiny.yaml", {"workload.arrival.rate_per_s": [1.0]},
                      overrides="workload.num_requests=20")
    assert loaded.tasks()[0].scenario().workload.num_requests == 20
    assert made.spec.set == ["workload.num_requests=20"]
    assert made.tasks()[0].scenario().workload.num_requests == 20


def test_a_base_that_is_no_path_is_named(tmp_path: Path) -> None:
    """make_sweep(scenario, ...) with a loaded Scenario (or its dict) raised os.fspath's
    "expected str, bytes or os.PathLike object, not Scenario" (found testing the Python API
    as a notebook would)."""
    from orcasim.scenario import load_scenario

    write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]")
    scenario = load_scenario(tmp_path / "tiny.yaml")
    for base in (scenario, scenario.given_data()):
        with pytest.raises(ScenarioError, match=r"^base = .*: expected a YAML file's path \(str or Path\)$"):
            make_sweep(base, {"workload.arrival.rate_per_s": [1.0]})  # type: ignore[arg-type]


def test_a_sweep_path_or_folder_that_is_no_path_is_named(tmp_path: Path) -> None:
    """load_sweep(None), run_sweep(sweep, None) and scenario_sweep(scenario, None) raised
    pathlib's "expected str, bytes or os.PathLike object, not NoneType" from inside (left
    alone by earlier reviews; found calling each from Python with None): one line naming
    the argument now, before anything is read or run."""
    from orcasim.scenario import load_scenario
    from orcasim.sweeps import run_sweep, scenario_sweep

    for path in (None, 3):
        with pytest.raises(ScenarioError, match=rf"^path = {path}: expected a sweep file's path \(str or Path\)$"):
            load_sweep(path)  # type: ignore[arg-type]
    sweep = load_sweep(write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]"))
    with pytest.raises(ScenarioError, match=r"^out_dir = None: expected the folder to write the sweep to"):
        run_sweep(sweep, None, progress=False)  # type: ignore[arg-type]
    assert not any(tmp_path.glob("*/sweep.csv"))
    own = load_scenario(Path(__file__).parent.parent / "scenarios" / "orca_paper" / "gpt3_13b.yaml")
    with pytest.raises(ScenarioError, match=r"^base_dir = None: expected the folder its data paths resolve from"):
        scenario_sweep(own, None)  # type: ignore[arg-type]


def test_a_sweeps_seeds_are_pinned_63_bit_ints(tmp_path: Path) -> None:
    """Seed 5's replications draw these seeds (a sweep's results reproduce only while they
    do): the first 64-bit word of each spawned SeedSequence, shifted right one bit so that
    it fits a non-negative int64 column; they reach past 2^62 (mutation testing found a
    left shift, a 32-bit word and a shift of two all passing every test)."""
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]", replications=8)
    seeds = load_sweep(path).replication_seeds()
    assert seeds[:3] == [7829437886636254564, 3462322709277726755, 862719652024447009]
    assert all(0 <= s < 2**63 for s in seeds) and max(seeds) >= 2**62


def test_make_sweeps_defaults_and_what_it_records(tmp_path: Path) -> None:
    """One replication on seed 0, named `sweep`; the base's path as given, and its folder,
    resolved, as every task's (data paths start there). Building a point's scenario leaves
    the sweep's base as it was."""
    grid_4x3 = write_grid_4x3(tmp_path)
    base = tmp_path / "tiny.yaml"
    sweep = make_sweep(base, {"workload.arrival.rate_per_s": [1.0, 2.0]})
    assert (sweep.spec.replications, sweep.spec.seed, sweep.spec.name) == (1, 0, "sweep")
    assert sweep.spec.base == str(base)
    assert sweep.base_dir == tmp_path.resolve()
    assert {t.base_dir for t in sweep.tasks()} == {str(tmp_path.resolve())}
    before = copy.deepcopy(sweep.base)
    assert before["workload"]["arrival"]["rate_per_s"] == 4.0  # the file's, after checking
    for task in load_sweep(grid_4x3).tasks()[:2] + sweep.tasks()[::-1]:  # every point
        task.scenario()
    assert sweep.base == before


def test_a_point_is_named_by_every_parameter() -> None:
    assert point_name("p0003-r01", {"a.b": 2, "c": "x"}) == "point p0003-r01 (a.b=2, c=x)"


@pytest.mark.parametrize("replications", [1, 2])
def test_two_replications_of_a_trace_are_said_to_be_alike(tmp_path: Path,
                                                          replications: int) -> None:
    """Two replications of a trace already repeat one run: said once, naming the first
    point, in full; one replication says nothing (mutation testing: `< 3` for `< 2`, and the
    warning's text, passed every test of the scope)."""
    import warnings

    from sweep_files import write_trace_scenario

    write_trace_scenario(tmp_path)
    path = tmp_path / "trace_sweep.yaml"
    path.write_text(f"name: t\nbase: s.yaml\nreplications: {replications}\ngrid:\n  parameters:\n"
                    "    workload.arrival.speedup: [1.0, 2.0]\n")
    sweep = load_sweep(path)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        sweep.warn_alike_replications()
    if replications == 1:
        assert said == []
        return
    assert [(w.category, str(w.message)) for w in said] == [(UserWarning, (
        "point p0000-r00 (workload.arrival.speedup=1.0): workload.arrival.kind = 'trace': "
        "every replication replays the same requests, so the 2 replications differ only where "
        "a system draws at random (a random or power_of_two router); a band of zero width "
        "across them is one sample, not a certain answer"))]
