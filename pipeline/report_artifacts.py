"""An artifact file as the report shows it: images embedded as ``data:`` URIs, CSV and Markdown pipe tables
and MLflow tables (``log_table``'s JSON) parsed into tables (numbers rounded like metrics), other JSON
pretty-printed and text cut to a size."""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

MAX_IMAGE_BYTES = 8 << 20  # larger images are listed, not embedded
MAX_TEXT_BYTES = 64 << 10  # JSON and text artifacts are shown up to this size
MAX_TABLE_ROWS = 30  # CSV / Markdown rows shown per artifact (the file in the store has them all)
MAX_TABLE_JSON_BYTES = 4 << 20  # an MLflow table (JSON) up to this size is read whole to show its rows
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".svg": "image/svg+xml",  # inert inside <img>: scripts in an SVG image do not run
}
TEXT_SUFFIXES = {".json", ".txt", ".log", ".yaml", ".yml", ".tsv", ".py", ".cfg", ".toml"}


@dataclass
class Artifact:
    """One artifact file of a run, as the report shows it."""

    path: str  # relative to the run's artifact root
    size: int
    kind: str  # "image" | "table" | "markdown" | "text" | "other"
    data_uri: str = ""  # images
    table: Table | None = None  # CSV, and Markdown pipe tables
    markdown: list[Block] = field(default_factory=list)
    text: str = ""  # JSON (pretty-printed) and text
    note: str = ""  # why something is not shown whole


@dataclass
class Cell:
    text: str
    title: str = ""  # full value on hover (numbers are rounded in the text)
    numeric: bool = False
    css: str = ""

    @property
    def td_class(self) -> str:
        kind = "num" if self.numeric else ("short" if len(self.text) <= 24 else "wrap")
        return f"{kind} {self.css}".strip()


@dataclass
class Table:
    header: list[str]
    rows: list[list[Cell]]
    note: str = ""  # e.g. "first 30 of 200 rows"


@dataclass
class Block:
    """A piece of a Markdown artifact: a table, or a paragraph of plain text."""

    table: Table | None = None
    text: str = ""
    heading: bool = False


def fmt_number(value: float) -> str:
    """Readable rounding for a table cell (the exact value goes into the cell's title)."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1e5:
        return f"{value:,.0f}"
    return f"{value:.5g}"


def number_cell(value: float) -> Cell:
    return Cell(fmt_number(value), title=repr(float(value)), numeric=True)


def text_cell(text: str) -> Cell:
    """A cell from a CSV or Markdown field: numbers are rounded like metrics, anything else kept."""
    try:
        value = float(text)
    except ValueError:
        return Cell(text)
    if text.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return Cell(text, numeric=True)
    cell = number_cell(value)
    cell.title = text
    return cell


def fmt_size(n: int) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _limited_rows(rows: list[list[str]], what: str) -> tuple[list[list[str]], str]:
    if len(rows) <= MAX_TABLE_ROWS:
        return rows, ""
    return rows[
        :MAX_TABLE_ROWS
    ], f"first {MAX_TABLE_ROWS} of {len(rows):,} {what}; the whole file is in the run"


def csv_table(text: str, delimiter: str = ",") -> Table:
    rows = [r for r in csv.reader(io.StringIO(text), delimiter=delimiter) if r]
    if not rows:
        return Table([], [], "empty")
    header, body = rows[0], rows[1:]
    body, note = _limited_rows(body, "rows")
    return Table(header, [[text_cell(c) for c in row] for row in body], note)


def _split_pipe_row(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    cells, cur, escaped = [], [], False
    for ch in line:
        if escaped:
            cur.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "|":
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    cells.append("".join(cur).strip())
    return cells


def _is_separator(line: str) -> bool:
    cells = _split_pipe_row(line)
    return bool(cells) and all(c and set(c) <= set(":- ") and "-" in c for c in cells)


def markdown_blocks(text: str) -> list[Block]:
    """Pipe tables become tables; other lines stay plain text (headings marked). Enough for the tables that
    experiments log; not a Markdown renderer."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    para: list[str] = []

    def flush() -> None:
        if para:
            blocks.append(Block(text=" ".join(para)))
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("|") and i + 1 < len(lines) and _is_separator(lines[i + 1]):
            flush()
            header = [c.replace("**", "").replace("`", "") for c in _split_pipe_row(stripped)]
            i += 2
            body: list[list[str]] = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                body.append(_split_pipe_row(lines[i]))
                i += 1
            body, note = _limited_rows(body, "rows")
            cells = [[text_cell(c.replace("**", "").replace("`", "")) for c in row] for row in body]
            blocks.append(Block(table=Table(header, cells, note)))
            continue
        if not stripped:
            flush()
        elif stripped.startswith("#"):
            flush()
            blocks.append(Block(text=stripped.lstrip("#").strip(), heading=True))
        else:
            para.append(stripped)
        i += 1
    flush()
    return blocks


def json_table(data: object) -> Table | None:
    """An MLflow table (``MlflowClient.log_table``: JSON ``{"columns": [...], "data": [[...], ...]}``, pandas'
    split orientation) as a table; None for any other JSON. Text stays as written (a translation that reads
    as a number is not rounded); numbers are rounded like metrics."""
    if not isinstance(data, dict) or set(data) != {"columns", "data"}:
        return None
    header, rows = data["columns"], data["data"]
    if not isinstance(header, list) or not isinstance(rows, list):
        return None
    if not all(isinstance(row, list) and len(row) == len(header) for row in rows):
        return None

    def cell(value: object) -> Cell:
        if isinstance(value, bool) or value is None:
            return Cell("" if value is None else str(value).lower())
        if isinstance(value, (int, float)):
            return number_cell(float(value))
        return Cell(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))

    body, note = _limited_rows(rows, "rows")
    return Table([str(h) for h in header], [[cell(v) for v in row] for row in body], note)


def _read_text(path: Path, size: int) -> tuple[str, str]:
    with open(path, "rb") as f:
        raw = f.read(MAX_TEXT_BYTES + 1)
    note = f"first {fmt_size(MAX_TEXT_BYTES)} of {fmt_size(size)}" if len(raw) > MAX_TEXT_BYTES else ""
    return raw[:MAX_TEXT_BYTES].decode("utf-8", errors="replace"), note


def read_artifact(rel: str, path: Path, twin: str = "") -> Artifact:
    """The artifact file ``path`` (``rel`` in its run) as the report shows it; ``twin``: the suffix of a
    Markdown table or figure of the same name, whose data a CSV then is."""
    size = path.stat().st_size
    suffix = Path(rel).suffix.lower()
    art = Artifact(rel, size, "other")
    if suffix in IMAGE_TYPES:
        if size > MAX_IMAGE_BYTES:
            art.note = f"not embedded: {fmt_size(size)} (limit {fmt_size(MAX_IMAGE_BYTES)})"
            return art
        data = path.read_bytes()
        if suffix == ".png" and not data.startswith(PNG_SIGNATURE):
            art.note = "not embedded: not a PNG file"
            return art
        art.kind = "image"
        art.data_uri = f"data:{IMAGE_TYPES[suffix]};base64," + base64.b64encode(data).decode("ascii")
        return art
    if suffix in (".csv", ".tsv") or suffix == ".md":
        text, note = _read_text(path, size)
        if note:  # a cut file would end in a partial row
            text = text.rsplit("\n", 1)[0]
        if suffix == ".md":
            art.kind = "markdown"
            art.markdown = markdown_blocks(text)
        else:
            art.kind = "table"
            art.table = csv_table(text, "\t" if suffix == ".tsv" else ",")
            if twin == ".md":
                art.note = "the same table as the Markdown artifact"
            elif twin:
                art.note = "the data of the figure"
        if note and art.table is not None:
            art.table.note = "; ".join(x for x in (art.table.note, note) if x)
        return art
    if suffix == ".json" and 0 < size <= MAX_TABLE_JSON_BYTES:
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            table = json_table(json.loads(path.read_text(encoding="utf-8")))
            if table is not None:
                art.kind, art.table = "table", table
                return art
    if suffix in TEXT_SUFFIXES or size == 0:
        text, note = _read_text(path, size)
        if suffix == ".json" and not note:
            with contextlib.suppress(ValueError):  # shown as it is
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        art.kind, art.text, art.note = "text", text, note
        return art
    art.note = "binary file, not shown"
    return art
