"""The tidy sweep table: one row per (point, system, replication)."""

from __future__ import annotations

import pandas as pd

from orcasim.sweeps.task import Outcome

KEY_COLUMNS = ["point", "replication", "seed", "system"]


def tidy_table(outcomes: list[Outcome]) -> pd.DataFrame:
    """Parameters (by dotted path) and summary metrics as columns, sorted by point,
    replication, then the scenario's system order, so that it never depends on which
    task finished first."""
    rows = []
    for o in sorted(outcomes, key=lambda o: (o.point, o.replication)):
        for system, summary in o.systems.items():
            rows.append({"point": o.point, "replication": o.replication, "seed": o.seed,
                         **o.params, "system": system, **summary})
    return pd.DataFrame(rows)


def param_columns(table: pd.DataFrame) -> list[str]:
    """The swept parameters: the columns between the seed and the system."""
    cols = list(table.columns)
    return cols[cols.index("seed") + 1 : cols.index("system")] if len(cols) else []
