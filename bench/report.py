"""A benchmark's human-readable report: one Markdown file with a title, text, tables and PNG
figures beside it in one directory (`--report DIR`), for any bench command.

Figures are drawn with matplotlib's object API (`matplotlib.figure.Figure`, rendered by the Agg
canvas), never through pyplot: no global figure state, no display, safe in any process.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def new_figure(width: float = 7.0, height: float = 4.5, dpi: int = 110) -> Figure:
    """A figure bound to the Agg canvas (PNG output, no display needed)."""
    figure = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(figure)
    return figure


def format_cell(value, digits: int = 3) -> str:
    """Numbers to `digits` significant figures, None as a dash, the rest as text (pipes escaped)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value).replace("|", "\\|")


class MarkdownReport:
    def __init__(self, directory: str | Path, title: str):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._parts: list[str] = [f"# {title}\n"]

    def heading(self, text: str, level: int = 2) -> None:
        self._parts.append(f"{'#' * level} {text}\n")

    def paragraph(self, text: str) -> None:
        self._parts.append(text.strip() + "\n")

    def table(self, headers: Sequence[str], rows: Sequence[Sequence], digits: int = 3) -> None:
        lines = ["| " + " | ".join(format_cell(h) for h in headers) + " |",
                 "|" + "|".join("---" for _ in headers) + "|"]
        for row in rows:
            if len(row) != len(headers):
                raise ValueError(f"a row of {len(row)} cells under {len(headers)} headers")
            lines.append("| " + " | ".join(format_cell(c, digits) for c in row) + " |")
        self._parts.append("\n".join(lines) + "\n")

    def figure(self, figure: Figure, name: str, caption: str) -> Path:
        """Save `figure` as DIR/name.png and reference it from the report."""
        if not _SAFE_NAME.match(name):
            raise ValueError(f"figure name {name!r}: letters, digits, '.', '_' and '-' only")
        path = self.directory / f"{name}.png"
        figure.savefig(path, format="png", bbox_inches="tight")
        self._parts.append(f"![{caption}]({path.name})\n\n*{caption}*\n")
        return path

    def write(self, filename: str = "report.md") -> Path:
        path = self.directory / filename
        path.write_text("\n".join(self._parts))
        return path
