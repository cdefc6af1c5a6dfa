"""Every module of or1 reads in one sitting: at most MAX_LINES lines (docs/STYLE.md: a module does one thing; when a
file grows a second responsibility, split it along that seam, not by squeezing lines)."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "or1"
MAX_LINES = 400
# the typed recipe schema (every key documented where it is declared) and the in-sandbox runner (one file of the
# standard library only, whose source the docker backend passes whole)
EXEMPT = {"config/schema.py", "sandbox/runner.py"}


def test_every_module_is_at_most_400_lines() -> None:
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in sorted(SRC.rglob("*.py"))}
    assert sizes, f"no modules under {SRC}"
    long = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in EXEMPT}
    assert not long, f"modules over {MAX_LINES} lines (split each along a seam): {long}"
