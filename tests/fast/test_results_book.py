"""The results book: docs/BENCHMARKS.md is a front page of claims, each with its command and a topic page under
docs/benchmarks/ that holds the number exactly as the row gives it; every topic page is reachable from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRONT = ROOT / "docs" / "BENCHMARKS.md"
PAGES = ROOT / "docs" / "benchmarks"
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
LINK = re.compile(r"\]\((benchmarks/[\w.-]+\.md)\)")


def claim_rows() -> list[list[str]]:
    """The cells of every claim row of the front page's tables (header and separator rows left out)."""
    rows = []
    for line in FRONT.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 6 and cells[0] != "Claim":
            rows.append(cells)
    return rows


def test_every_claim_names_its_number_command_date_and_page():
    rows = claim_rows()
    assert len(rows) >= 20 and len(FRONT.read_text().splitlines()) <= 250
    for claim, today, anchor, command, machine_date, page in rows:
        pages = LINK.findall(page)
        assert pages and all((FRONT.parent / p).is_file() for p in pages), (claim, page)
        assert "`" in command or "same command" in command, (claim, command)
        assert re.search(r"20\d\d-\d\d-\d\d", machine_date), (claim, machine_date)
        text = "\n".join((FRONT.parent / p).read_text() for p in pages)
        missing = [n for n in NUMBER.findall(today) if n not in text]
        assert not missing, f"{claim}: {missing} of `{today}` are not on {pages}"


def test_every_topic_page_is_on_the_front_page_and_says_where_it_ran():
    linked = set(LINK.findall(FRONT.read_text()))
    for page in sorted(PAGES.glob("*.md")):
        assert f"benchmarks/{page.name}" in linked, page.name
        text = page.read_text()
        assert text.startswith("# ") and re.search(r"20\d\d-\d\d-\d\d", text), page.name
        history = text.split("\n## History\n", 1)
        if len(history) == 2:  # what a result replaced: after the current one, each part headed by its date
            assert re.findall(r"^### 20\d\d-\d\d-\d\d", history[1], re.M), page.name
