"""`python -m calibrate profile | fit | replay | kernels | logs`: measure, fit, and check the
cost model."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import yaml

from calibrate.logs import AUTO, DEFAULT_PARAMETERS
from orcasim.config import ScenarioError
from orcasim.exits import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    INTERRUPTED_TEXT,
    sigterm_as_interrupt,
)
from orcasim.fidelity import MEASURED_FORMATS
from orcasim.paths import check_in_a_folder


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with sigterm_as_interrupt():
            args.func(args)
    except (ScenarioError, ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(INTERRUPTED_TEXT, file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # the machine, not the input: a full disk, a read-only folder
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}; nothing was left half-written", file=sys.stderr)
        return EXIT_ENVIRONMENT
    return 0


class OneLineParser(argparse.ArgumentParser):
    """A command line that does not parse is one line, as orcasim's (argparse prints the
    usage block first); subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _at_least_one(text: str) -> int:
    """An integer >= 1 (argparse names the option and prints this as its error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def _seed(text: str) -> int:
    """A seed numpy and torch both take: an integer from 0 to 2**64 - 1 (-3 read 'error:
    expected non-negative integer' and 1e23 'error: Overflow when unpacking long long',
    neither naming --seed)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer from 0 to {MAX_SEED}")
    return value


MAX_SEED = 2**64 - 1  # torch's Generator.manual_seed takes no more


def _threads(text: str) -> int:
    """Torch's CPU threads: 1 to this machine's cores (100000 crashed torch, a segmentation
    fault; 1e23 read 'error: Overflow when unpacking long long'; more threads than cores
    only share them, and the README's timings are single-threaded)."""
    value, cores = _at_least_one(text), os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer from 1 to {cores}, "
                                         "this machine's cores")
    return value


def _repeats(text: str) -> int:
    """Timings of each shape, whose median is kept: 1 to MAX_REPEATS (1e12 ran on without a
    row, for ever; 1e23 read 'expected an integer >= 1')."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer from 1 to {MAX_REPEATS}")
    return value


# Far past what a median needs: the default 20 timed every shape of tiny in 240 s on a
# shared 2-core machine (python -m calibrate kernels --model tiny --device cpu), so 10,000
# would take about 33 hours there.
MAX_REPEATS = 10_000


def _above_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
    return value


def prior_weight(text: str) -> float | str:
    """An argparse type: `auto` or a finite number >= 0 (`--prior-weight`, here and in
    scenarios/validation/leave_one_out.py)."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return finite_at_least_zero(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {AUTO} or a finite number >= 0") from None


def finite_at_least_zero(text: str) -> float:
    """An argparse type: a finite number >= 0 (`--prior-weight`'s weight)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0")
    return value


def _writable(path: Path, force: bool, what: str, inputs: tuple[Path, ...] = ()) -> None:
    """Nothing is overwritten without --force, and a folder or the command's own input
    never; a path that cannot be made is refused too: checked before any work is done (a
    fit or a profile takes minutes)."""
    if path.is_dir():
        raise ScenarioError(f"--out {path} is a folder; expected the path of the {what} file "
                            "to write (--force replaces a file, never a folder)")
    if any(path.resolve() == p.resolve() for p in inputs):
        raise ScenarioError(f"--out {path} is an input of this command; expected another path "
                            f"for the {what} (--force never replaces an input)")
    check_in_a_folder(path, what)
    if what == "cost YAML" and path.suffix.lower() == ".json":
        # `cost: {kind: fitted, path: c.json}` reads a .json as a DistServe profile: the file
        # written was then refused as 'a DistServe profile needs cost.model ...'
        raise ScenarioError(f"--out {path}: a cost file named .json is read as a DistServe "
                            "profile; expected a .yaml path")
    if path.exists() and not force:
        raise FileExistsError(f"{path} already exists; pass --force to overwrite it")
    folder = next((p for p in path.absolute().parents if p.exists()), None)
    if folder is not None:  # a folder no file can be written to: said before the fit, not after
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as e:
            raise PermissionError(e.errno or errno.EACCES, f"cannot write the {what} here: "
                                  f"{e.strerror or e}", str(folder)) from None


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m calibrate", description=__doc__)
    sub = p.add_subparsers(required=True)
    prof = sub.add_parser("profile", help="time real iterations over a grid; write a CSV")
    _model_options(prof, "build only this many layers (profile times are scaled to the full count)")
    prof.add_argument("--grid", choices=("default", "ci"), default="default")
    prof.add_argument("--max-tokens", type=_at_least_one, default=1024, help="largest context in the grid")
    prof.add_argument("--out", type=Path, required=True, help="profile CSV to write")
    prof.add_argument("--force", action="store_true", help="overwrite --out")
    prof.set_defaults(func=cmd_profile)
    fit = sub.add_parser("fit", help="fit the cost model to a profile CSV; write a YAML")
    fit.add_argument("profile", type=Path, help="a profile CSV of python -m calibrate profile")
    fit.add_argument("--out", type=Path, required=True, help="cost YAML to write (.yaml)")
    fit.add_argument("--knots", default="64,256", help="token counts where the slope may change")
    fit.add_argument("--target", choices=("time_s", "measured_s", "cpu_s", "device_s"), default="time_s")
    fit.add_argument("--force", action="store_true", help="overwrite --out")
    fit.set_defaults(func=cmd_fit)
    rep = sub.add_parser("replay", help="serve a scenario for real twice, simulate it, compare")
    rep.add_argument("scenario", type=Path, help="scenario YAML with an iteration_level system")
    # Here the layers run for real: the simulation prices them only with a fit of them.
    _model_options(rep, "run only this many layers for real (give --cost a fit of those layers)")
    rep.add_argument("--cost", type=Path, help="fitted cost YAML to simulate with (default: the scenario's)")
    rep.add_argument("--out", type=Path, help="results folder (default results/calibrate/<scenario name>)")
    rep.add_argument("--load", type=_above_zero,
                     help="rescale arrivals to this fraction of the fitted capacity")
    rep.add_argument("--force", action="store_true", help="replace --out's results folder")
    rep.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                     help="cpu: advance time by each real iteration's CPU time (for a shared machine)")
    rep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario field, as `orcasim run --set`")
    rep.set_defaults(func=cmd_replay)
    kern = sub.add_parser("kernels", help="time one layer's kernels as an engine runs them "
                                          "(CUDA graphs or --eager); write a CSV")
    kern.add_argument("--model", default="gpt3-13b", help=MODEL_HELP)
    kern.add_argument("--tensor-parallel", type=_at_least_one, nargs="+", default=[1],
                      help="time one rank's shard at each degree (default 1)")
    kern.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    kern.add_argument("--layers", type=_at_least_one, default=8,
                      help="weight copies run in turn, so that none is read from L2")
    kern.add_argument("--repeats", type=_repeats, default=20,
                      help=f"timings of each shape, whose median is kept (1 to {MAX_REPEATS})")
    kern.add_argument("--max-tokens", type=_at_least_one, default=8192,
                      help="largest token count (and prompt) timed")
    kern.add_argument("--eager", action="store_true",
                      help="launch kernel by kernel from Python instead of replaying a CUDA graph")
    kern.add_argument("--out", type=Path, required=True, help="kernel timings CSV to write")
    kern.add_argument("--force", action="store_true", help="overwrite --out")
    kern.set_defaults(func=cmd_kernels)
    logs = sub.add_parser("logs", help="fit a scenario's cost to real serving logs, simulating "
                                       "in the loop; report the error on logs left out")
    logs.add_argument("logs", type=Path, nargs="+", help="per-request logs of real runs")
    logs.add_argument("--scenario", type=Path, required=True,
                      help="the deployment, scheduler and cost kind to fit (its workload is "
                           "replaced by each log's)")
    logs.add_argument("--out", type=Path, required=True, help="calibrated cost YAML to write")
    logs.add_argument("--fit", action="append",
                      help="cost coefficients to fit, by dotted path inside `cost`, comma-separated "
                           "or the flag repeated (default: " + ",".join(DEFAULT_PARAMETERS) + ")")
    logs.add_argument("--system", help="the scenario's system the logs come from (default: first)")
    logs.add_argument("--format", dest="fmt", default="auto", choices=MEASURED_FORMATS,
                      help="log format: auto, orcasim, vllm or aiperf")
    logs.add_argument("--no-leave-one-out", dest="loo", action="store_false",
                      help="skip refitting with each log left out")
    logs.add_argument("--force", action="store_true", help="overwrite --out")
    logs.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a scenario field, as `orcasim run --set`")
    logs.add_argument("--prior-weight", type=prior_weight, default=0.0, metavar="W",
                      help="pull each fitted term toward the scenario's value: add W times its "
                           "squared log-ratio to the loss (default 0: no prior; auto: W = the "
                           "loss of a fit without one / (logs x ln(4)^2))")
    logs.set_defaults(func=cmd_logs)
    return p


MODEL_HELP = "a shape of calibrate/model.py's table (tiny, gpt3-13b, llama2-70b, ...)"


def _model_options(p: argparse.ArgumentParser, layers_help: str) -> None:
    p.add_argument("--model", default="tiny", help=MODEL_HELP)
    p.add_argument("--layers", type=_at_least_one, help=layers_help)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=_threads, default=1,
                   help="torch CPU threads (default 1: see README, multi-threaded timings are bimodal "
                        "on a small shared machine)")
    p.add_argument("--seed", type=_seed, default=0)


def _setup_torch(args: argparse.Namespace) -> None:
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device = cuda: no CUDA device is available")


def cmd_profile(args: argparse.Namespace) -> None:
    from calibrate.model import build_model, model_args
    from calibrate.profile import (
        GRIDS,
        check_grid_fits,
        header_lines,
        largest_context,
        profile_rows,
        write_profile,
    )

    _writable(args.out, args.force, "profile CSV")
    try:  # what fit would refuse, before minutes of timing
        check_grid_fits(GRIDS[args.grid], args.max_tokens)
    except ScenarioError as e:
        raise ScenarioError(f"--max-tokens {args.max_tokens}: the {args.grid} grid has {e} for "
                            "python -m calibrate fit (a larger --max-tokens)") from None
    _setup_torch(args)
    full = model_args(args.model)
    shape = model_args(args.model, args.layers)
    # Positions up to the grid's largest context, the most a shape holds: --max-tokens only
    # caps the grid, and a rotary table of 1e8 positions ran out of memory (1e23 overflowed).
    model = build_model(shape, args.device, args.seed,
                        max_positions=largest_context(GRIDS[args.grid], args.max_tokens) + 1)
    rows = profile_rows(model, GRIDS[args.grid], args.max_tokens, full.n_layers / shape.n_layers,
                        np.random.default_rng(args.seed), lambda m: print(m, file=sys.stderr))
    dtype = model.lm_head.weight.dtype
    write_profile(args.out, header_lines(args.model, shape, full.n_layers, args.device, dtype, args.grid), rows,
                  args.force)
    print(f"wrote {len(rows)} rows to {args.out}")


def cmd_fit(args: argparse.Namespace) -> None:
    from calibrate.fit import fit_profile, write_cost_model
    from calibrate.profile import read_profile

    if not args.profile.is_file():
        what = ("is a folder" if args.profile.is_dir()
                else "is not a regular file" if args.profile.exists() else "not found")
        raise FileNotFoundError(f"profile '{args.profile}' {what}; expected a CSV of python -m "
                                "calibrate profile")
    knots = knots_of(args.knots)
    _writable(args.out, args.force, "cost YAML", (args.profile,))
    header, rows = read_profile(args.profile, args.target, knots)
    profiled, full = header.get("layers_profiled"), header.get("layers_full")
    if args.target != "time_s" and profiled != full:
        # The profiler scales time_s alone to the whole model; the other columns are the
        # profiled layers' times, which a replay with --layers runs (gpu_check.sh), but which
        # priced a scenario of the whole model 10 times cheap (4 of GPT-3 13B's 40 layers).
        warnings.warn(f"{args.profile}: {args.target} is the time of the {profiled} of {full} "
                      f"layers profiled (time_s alone is scaled to all {full}): this fit prices "
                      f"those {profiled} layers, as a replay with --layers {profiled} runs them, "
                      f"not the whole model (fit time_s for that)", UserWarning, stacklevel=2)
        header = {**header, "fitted_layers": f"{profiled} of {full} ({args.target} is the "
                                             "profiled layers' time; time_s alone is scaled)"}
    try:
        doc = fit_profile(rows, knots, target=args.target)
    except ScenarioError as e:
        raise ScenarioError(f"{args.profile}: {e}") from None
    write_cost_model(args.out, doc, args.profile, header, args.target, args.force)
    print(yaml.safe_dump({"quality": doc["quality"]}, sort_keys=False), end="")
    print(f"wrote {args.out}")


def cmd_kernels(args: argparse.Namespace) -> None:
    from calibrate.layer_ops import check_degree, check_layers, device_memory_bytes, measure
    from calibrate.model import model_args
    from orcasim.results import write_file_atomically

    model_args(args.model)  # a known shape, else one line naming them
    for tp in args.tensor_parallel:
        check_degree(args.model, tp)
    _writable(args.out, args.force, "kernel timings CSV")
    if args.device == "cuda":
        _setup_torch(args)
    check_layers(args.model, args.tensor_parallel, args.layers, args.device,
                 device_memory_bytes(args.device))
    rows = measure(args.model, args.tensor_parallel, args.device, args.layers, args.repeats,
                   args.max_tokens, args.eager)
    write_file_atomically(args.out, lambda tmp: tmp.write_text("\n".join(rows) + "\n"),
                          replace=args.force)
    print(f"wrote {len(rows) - 1} rows to {args.out}")


def cmd_replay(args: argparse.Namespace) -> None:
    import json

    from calibrate.model import build_model, model_args
    from calibrate.replay import replay
    from calibrate.report import write_replay
    from orcasim.cost.fitted import FittedCostConfig
    from orcasim.results import check_out_dir
    from orcasim.scenario import load_scenario

    model_args(args.model, args.layers)  # a bad --layers: its error alone, not a warning first
    _setup_torch(args)
    scenario = load_scenario(args.scenario, args.set)
    out = args.out or Path("results/calibrate") / scenario.name
    check_out_dir(out, args.force)  # before the real runs, which take minutes
    if args.cost:
        cost = FittedCostConfig(kind="fitted", path=str(args.cost.resolve()))
        scenario = scenario.model_copy(update={"cost": cost})
    else:
        warn_layers_unpriced(args.model, args.layers, scenario)
    max_tokens = scenario.workload.max_tokens
    model = build_model(model_args(args.model, args.layers), args.device, args.seed,
                        max_positions=max_tokens + 1)
    with warnings.catch_warnings():
        if args.cost and args.layers:  # a fit of these layers is what this replay runs
            warnings.filterwarnings("ignore", message=rf".* was fitted on the time of {args.layers} of ")
        result = replay(model, scenario, args.scenario.resolve().parent, args.seed, args.load, args.clock)
    write_replay(out, result, args.force)
    print(result.table.to_string(float_format=lambda v: f"{v:.4g}"))
    print(json.dumps({k: v for k, v in result.report.items() if k != "metrics"}))
    print(f"wrote {out}/fidelity.json and fidelity.png")


def warn_layers_unpriced(model: str, layers: int | None, scenario: Any) -> None:
    """`replay --layers N` runs N of the model's layers for real; without `--cost` the
    simulation prices them with the scenario's own cost, which prices the whole model
    unless it is a fit of those N layers (`calibrate fit --target measured_s`): the
    comparison read a 4-layer engine against a 40-layer price, silently."""
    from calibrate.model import model_args
    from orcasim.cost.fitted import FittedCostConfig, read_fitted_yaml
    from orcasim.paths import resolve_data_path

    full = model_args(model).n_layers
    if layers is None or layers == full:
        return
    cost = scenario.cost
    if isinstance(cost, FittedCostConfig) and Path(cost.path).suffix != ".json":
        with contextlib.suppress(FileNotFoundError, ScenarioError):
            provenance = read_fitted_yaml(resolve_data_path(cost.path)).get("provenance")
            fitted = provenance.get("fitted_layers") if isinstance(provenance, dict) else None
            if isinstance(fitted, str) and fitted.startswith(f"{layers} of "):
                return  # a fit of these layers: what this replay runs
    warnings.warn(f"--layers {layers}: the real engine runs {layers} of {model}'s {full} layers, "
                  "but without --cost the simulation prices the scenario's cost, of the whole "
                  "model unless fitted on those layers; expected --cost with a fit of them "
                  "(python -m calibrate fit --target measured_s)", UserWarning, stacklevel=2)


def knots_of(text: str) -> list[int]:
    """`--knots`: comma-separated token counts >= 1, increasing."""
    try:
        knots = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        knots = []
    if not knots or min(knots) < 1 or knots != sorted(set(knots)):
        raise ScenarioError(f"--knots = {text!r}: expected increasing token counts >= 1, "
                            "comma-separated (e.g. 64,256)")
    return knots


def fit_names(text: str) -> tuple[str, ...]:
    """`--fit`'s comma-separated coefficients: at least one, each once."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    if not names:
        raise ScenarioError(f"--fit {text!r}: no coefficient named; expected one or more dotted "
                            "paths inside `cost`, comma-separated (e.g. overhead.per_iteration_s)")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise ScenarioError(f"--fit {text!r}: {twice} given twice; expected each coefficient once")
    return names


def cmd_logs(args: argparse.Namespace) -> None:
    from calibrate.logs import (
        current_values,
        fit_under,
        ineffective_terms,
        inline_calibrated,
        leave_one_out,
        poor_fit,
        read_logs,
        spread_terms,
        unidentified_terms,
        write_calibrated,
    )
    from orcasim.fidelity import check_measured_after_warmup, check_replay_overrides
    from orcasim.scenario import data_inputs, load_scenario

    _writable(args.out, args.force, "cost YAML", (args.scenario, *args.logs))
    check_replay_overrides(args.set)
    base_dir = args.scenario.resolve().parent
    # The logs are replayed at the base values: the own sweep's points are not built, nor
    # rebuilt at each of the fit's evaluations (`with_cost`, 30 ms a time for 14 points,
    # where a refused point read as an infinite loss).
    loaded = load_scenario(args.scenario, args.set, own_sweep=False)
    if loaded.sweep is not None:
        warnings.warn(f"{loaded.name}'s own sweep over {loaded.sweep.parameter} is not replayed: "
                      "the logs are fitted at the scenario's base values (--set the parameter "
                      "to fit at another)", UserWarning, stacklevel=2)
        loaded = loaded.model_copy(update={"sweep": None})
    # The files the scenario reads too: --force wrote over the profile fit its cost loads,
    # and the new file then loaded itself (a tester's finding).
    _writable(args.out, args.force, "cost YAML", tuple(data_inputs(loaded, base_dir)))
    scenario = inline_calibrated(loaded, base_dir)
    system = args.system or scenario.systems[0].name
    if system not in {s.name for s in scenario.systems}:
        raise ScenarioError(f"--system = {system!r}: expected one of "
                         f"{', '.join(s.name for s in scenario.systems)}")
    # Repeated, each --fit adds (the last alone was fitted, silently).
    parameters = fit_names(",".join(args.fit) if args.fit else ",".join(DEFAULT_PARAMETERS))
    current_values(scenario, parameters, system)  # a name that cannot be fitted fails now, not after reading logs
    logs = read_logs(args.logs, args.fmt)
    for log in logs:  # before any replay: the fit compares only these (`after_warmup`)
        check_measured_after_warmup(log.path, log.real, log.fmt, scenario.warmup_s, "log")
    if args.loo and len(logs) == 1:  # said, where an empty error_left_out was all it showed
        warnings.warn(f"one log ({logs[0].name}): none is left out, so error_left_out stays empty; "
                      "give two or more runs to score the fit on one it never saw",
                      UserWarning, stacklevel=2)
    result = fit_under(scenario, logs, system, parameters, base_dir, args.prior_weight)
    if result.prior is not None and set(result.prior.centre) != set(parameters):
        free = [p for p in parameters if p not in result.prior.centre]
        warnings.warn(f"--prior-weight: {', '.join(free)} {'is' if len(free) == 1 else 'are'} 0 in "
                      "the scenario, which has no log-ratio: fitted without a prior",
                      UserWarning, stacklevel=2)
    for said in [*unidentified_terms(scenario, logs, system, result.parameters, base_dir),
                 *ineffective_terms(scenario, logs, system, result.parameters, base_dir)]:
        warnings.warn(said, UserWarning, stacklevel=2)
    poor = poor_fit(result, system)
    if poor is not None:
        warnings.warn(poor, UserWarning, stacklevel=2)
    if args.loo and len(logs) > 1:
        leave_one_out(scenario, logs, system, result, parameters, base_dir, args.prior_weight)
        for said in spread_terms(result):
            warnings.warn(said, UserWarning, stacklevel=2)
    write_calibrated(args.out, scenario, logs, system, result, args.set, args.force)
    print(yaml.safe_dump({"parameters": result.parameters, "error_fitted": result.fitted_errors,
                          "error_left_out": result.left_out_errors}, sort_keys=False), end="")
    print(f"wrote {args.out}")


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    # As orcasim's commands say it: what happened, not the line of code that noticed it.
    print(f"warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    warnings.showwarning = _show_warning  # the command's alone: tests calling main() record theirs
    sys.exit(main())
