"""Markdown tables for the report scripts under scenarios/ (results/*/README.md)."""

from __future__ import annotations

import pandas as pd


def cell(value: object) -> str:
    """Floats to three significant figures; anything else as written."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """The frame as the lines of a Markdown table, its columns as the header."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |"
                    for row in frame.itertuples(index=False)]
