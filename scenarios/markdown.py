"""Markdown tables for the report scripts under scenarios/ (results/*/README.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def cell(value: object) -> str:
    """Floats to three significant figures; anything else as written."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """The frame as the lines of a Markdown table, its columns as the header."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |"
                    for row in frame.itertuples(index=False)]


def section(title: str, *body: str | list[str]) -> list[str]:
    """A `## title` section: its paragraphs (strings) and tables (lists of lines)."""
    lines = [f"## {title}", ""]
    for part in body:
        lines += [*part, ""] if isinstance(part, list) else [part, ""]
    return lines


def write_readme(path: Path, lines: list[str]) -> None:
    """Write a report's README (and echo it, as the report scripts do)."""
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
    print(path.read_text())
