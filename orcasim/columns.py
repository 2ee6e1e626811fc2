"""The column layout of orcasim's result tables (the tidy sweep table, a capacity table):
which columns are keys and which are parameters. Shared by the writers (`orcasim.sweeps`,
`orcasim.capacity`) and the pure plot functions (`orcasim.plots`), and below all of them,
so that the plots need not import a writer's package (which imports the results writer,
which draws with the plots)."""

from __future__ import annotations

import pandas as pd

KEY_COLUMNS = ["point", "replication", "seed", "system"]


def param_columns(table: pd.DataFrame) -> list[str]:
    """The swept parameters: the columns between the seed and the system."""
    cols = list(table.columns)
    return cols[cols.index("seed") + 1 : cols.index("system")] if len(cols) else []


def point_parameters(table: pd.DataFrame) -> list[str]:
    """A capacity table's (`orcasim capacity`) configuration parameters: its columns
    between `point` and `system` (none without both)."""
    columns = list(table.columns)
    if "point" not in columns or "system" not in columns:
        return []
    return columns[columns.index("point") + 1:columns.index("system")]


def param_names(params: list[str]) -> list[str]:
    """Each swept parameter's name in labels and file names: the last part of its path
    (`rate_per_s`), or every parameter's whole path where two last parts clash."""
    short = [p.rsplit(".", 1)[-1] for p in params]
    return short if len(set(short)) == len(short) else params


__all__ = ["KEY_COLUMNS", "param_columns", "param_names", "point_parameters"]
