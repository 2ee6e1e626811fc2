"""Running one task and its outcome: the only code a backend ships to a worker."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from orcasim.config import ScenarioError
from orcasim.sweeps.spec import ParamValue, Task, point_name


class JsonRecord:
    """A dataclass written as one JSON file per finished job and read back on --resume."""

    def to_json(self) -> str:
        # NaN summaries (e.g. TPOT with one-token outputs) round-trip through Python's json.
        return json.dumps(asdict(self), indent=1) + "\n"  # type: ignore[call-overload]

    @classmethod
    def read(cls, path: Path) -> Self:
        """`from_json` of the file at `path`; bytes that are not UTF-8 (a file some other
        tool wrote, or damaged) are the same one-line refusal, not a UnicodeDecodeError's
        traceback (a tester's finding)."""
        return cls.from_json(path.read_bytes().decode("utf-8", errors="replace"), str(path))

    @classmethod
    def from_json(cls, text: str, source: str = "outcome") -> Self:
        """Read back `to_json`; anything else (a corrupt or foreign file) is a ScenarioError."""
        try:
            return cls(**json.loads(text))
        except (json.JSONDecodeError, TypeError):
            raise ScenarioError(f"{source}: not an outcome this version wrote; delete it or "
                                "start over with --force") from None


def first_line(error: BaseException | str) -> str:
    """An error as one line, with its type unless it is bad input (whose message says what
    was expected): what a failed job records."""
    text = error if isinstance(error, str) else str(error) if isinstance(error, ScenarioError) \
        else f"{type(error).__name__}: {error}"
    return text.splitlines()[0] if text else "unknown error"


@dataclass
class Outcome(JsonRecord):
    """What a task produced: per-system summaries, or the error that stopped it."""

    id: str
    point: int
    replication: int
    seed: int
    params: dict[str, ParamValue]
    ok: bool
    systems: dict[str, dict[str, float]] = field(default_factory=dict)
    error: str = ""
    wall_s: float = 0.0
    # What the run warned of, in order, each once: a worker's warnings go nowhere a user
    # sees (a pool's print raw, Ray's not at all), so the parent shows these (`show_warnings`).
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def failed(cls, task: Task, error: BaseException | str, wall_s: float = 0.0,
               said: list[str] | None = None) -> Outcome:
        return cls(task.id, task.point, task.replication, task.seed, task.params, False,
                   error=first_line(error), wall_s=wall_s, warnings=said or [])


def run_task(task: Task) -> Outcome:
    """Run one task. Any exception becomes a failed Outcome: a bad point never kills a sweep."""
    from orcasim.metrics import offered_rps, served_rps
    from orcasim.run import run_scenario
    from orcasim.workload.arrivals import initial_sends

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            scenario = task.scenario()
            result = run_scenario(scenario, base_dir=Path(task.base_dir))
        except Exception as e:  # noqa: BLE001 - recorded per point, reported at the end
            # What it warned of before it failed may say why (a saturated system, say).
            said = list(dict.fromkeys(str(w.message) for w in caught))
            return Outcome.failed(task, e, time.perf_counter() - start, said)
    said = list(dict.fromkeys(str(w.message) for w in caught))
    # The realised load beside the summary: whether a system keeps up is judged against it.
    first = initial_sends(scenario.workload.arrival)
    systems: dict[str, dict[str, Any]] = {
        n: {"offered_rps": offered_rps(r.requests["arrival_s"].to_numpy(), first, scenario.warmup_s),
            "served_rps": served_rps(r.requests["arrival_s"].to_numpy(),
                                     r.requests["finish_s"].to_numpy(dtype=float), scenario.warmup_s),
            **r.summary}
        for n, r in result.systems.items()
    }
    return Outcome(task.id, task.point, task.replication, task.seed, task.params, True,
                   systems=systems, wall_s=time.perf_counter() - start, warnings=said)


def show_warnings(outcome: Outcome, shown: set[str]) -> None:
    """Warn, here, of what a task's run warned of wherever it ran: the same text from every
    backend, naming the point; a message many points share once, naming the first
    (`shown`: this sweep's so far; Python's own memory of shown warnings is wiped by each
    in-process task's `catch_warnings`)."""
    for message in outcome.warnings:
        if message not in shown:
            shown.add(message)
            warnings.warn(f"{point_name(outcome.id, outcome.params)}: {message}", UserWarning,
                          stacklevel=2)
