"""The README and the docs/ pages show only what exists: every `or1 ...` command line they show parses (run in-process
with --help appended, exit 0), and every repository path, link and anchor they name is there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from or1.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")  # an inline code span; it may wrap onto the next line
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A command line: `or1 ...`, also written `$ or1`, `.venv/bin/or1` or (the Justfile's) `{{bin}}/or1`.
COMMAND = re.compile(r"^(?:\$ )?(?:\.venv/bin/|\{\{bin\}\}/)?(or1 .*)$")

# A repository path starts with one of these folders; `or1/...` names a module under src/. Anything else in
# backticks (run outputs such as `runs/...`, `tiny/...` that `just tiny` makes, `<stage>/...`, hub ids, options) is
# not a repository path and is not checked.
REPO_FOLDERS = tuple("src/ tests/ stages/ data/ bench/ scripts/ sandbox/ docs/ .ci/ or1/".split())
# Paths with these stand for many files (`data/synthetic*.py`, `step_<k>/`, `{base,final}`, `...`): not checked.
PATTERN = re.compile(r"[<>*{}$]|\.\.\.")
# A capitals-only name in a path is a placeholder (`data/NAME.yaml`): some file must fill it.
CAPITALS = re.compile(r"^[A-Z][A-Z0-9_]*(\.\w+)?$")


def split_page(page: Path) -> tuple[list[tuple[str, str]], str]:
    """The page's fenced blocks (info string, text) and its prose with the fenced blocks removed."""
    text = page.read_text()
    return FENCE.findall(text), FENCE.sub("", text)


def spans(prose: str) -> list[str]:
    return [" ".join(span.split()) for span in SPAN.findall(prose)]


def block_lines(info: str, text: str) -> list[str]:
    """A fenced block's lines, continuation lines joined; a shell block's `#` comments dropped (they are prose)."""
    lines = text.replace("\\\n", " ").splitlines()
    if info.strip() in ("bash", "sh", "shell", "console"):
        lines = [line.split(" #")[0] if not line.lstrip().startswith("#") else "" for line in lines]
    return [line.strip() for line in lines if line.strip()]


def command_lines() -> list[tuple[str, str]]:
    """(page, command) for every command line: a fenced block's line, or a whole inline code span, starting
    `or1 `. Spans such as `or1 train` in a sentence are commands too and parse; no line is skipped."""
    found = []
    for page in PAGES:
        blocks, prose = split_page(page)
        candidates = spans(prose) + [line for info, text in blocks for line in block_lines(info, text)]
        for candidate in candidates:
            match = COMMAND.match(candidate)
            if match:
                found.append((page.relative_to(ROOT).as_posix(), match.group(1)))
    return list(dict.fromkeys(found))


def resolve(args: list[str]):
    """The command the words name (`config show` is a subcommand of a group). Typer keeps its own copy of click, so
    a group is whatever has subcommands."""
    command = typer.main.get_command(app)
    for word in args:
        subcommands = getattr(command, "commands", {})
        if word not in subcommands:
            break
        command = subcommands[word]
    return command


def help_args(command_line: str) -> list[str]:
    """The command's arguments with --help appended. A usage line's optional parts (`[--rebuild]`) lose their
    brackets and `\\|` in a table is `|`, so each flag is still passed (a flag that does not exist fails). A line
    that ends in an option that takes a value, with the value left out (`or1 score -o` in a sentence: it names the
    flag), gets `VALUE` so that --help is not taken for the value."""
    words = shlex.split(command_line.replace("\\|", "|"))[1:]
    words = [word.strip("[]") for word in words if word.strip("[]")]
    if words and words[-1].startswith("-"):
        options = {opt: param for param in resolve(words).params for opt in param.opts + param.secondary_opts}
        param = options.get(words[-1])
        if param is not None and param.param_type_name == "option" and not param.is_flag and not param.count:
            words.append("VALUE")
    return [*words, "--help"]


@pytest.mark.parametrize(("page", "command_line"), command_lines())
def test_command_lines_parse(page: str, command_line: str) -> None:
    result = CliRunner().invoke(app, help_args(command_line))
    assert result.exit_code == 0, f"{page}: `{command_line}` does not parse:\n{result.output}"


def repo_paths(page: Path) -> list[str]:
    """Words in the page's code (spans and fenced blocks) that start with a repository folder."""
    blocks, prose = split_page(page)
    words = [w for s in spans(prose) for w in s.split()]
    words += [w for info, text in blocks for line in block_lines(info, text) for w in line.split()]
    paths = []
    for word in words:
        word = word.split("=")[-1].split("::")[0].lstrip("([\"'").rstrip(")],;:.\"'")
        if word.startswith(REPO_FOLDERS) and not PATTERN.search(word):
            paths.append(word)
    return paths


def exists(path: str) -> bool:
    """At the repository root; else under src/ or src/or1/ (docs/ARCHITECTURE.md names modules from there). A
    capitals-only name stands for any name with its suffix (`data/NAME.yaml`: some data/*.yaml)."""
    parts = path.rstrip("/").split("/")
    pattern = "/".join("*" + Path(part).suffix if CAPITALS.match(part) else part for part in parts)
    for base in (ROOT, ROOT / "src", ROOT / "src" / "or1"):
        if (base / path).exists() or (pattern != path.rstrip("/") and any(base.glob(pattern))):
            return True
    return False


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading's gets -1, -2, ... as on GitHub."""
    _, prose = split_page(page)
    found, counts = set(), {}
    for heading in re.findall(r"^#+ (.+)$", prose, re.M):
        base = slug(heading)
        found.add(base if base not in counts else f"{base}-{counts[base]}")
        counts[base] = counts.get(base, 0) + 1
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_paths_and_links_exist(page: Path) -> None:
    missing = [path for path in repo_paths(page) if not exists(path)]
    _, prose = split_page(page)
    for target in LINK.findall(SPAN.sub("", prose)):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            missing.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            missing.append(f"{target} (no heading makes #{anchor})")
    assert not missing, f"{page.relative_to(ROOT)} names what is not there: {missing}"


def test_readme_is_short_and_links_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"README.md links no line to {unlinked}"
