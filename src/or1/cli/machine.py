"""`or1 doctor` and `or1 sandbox check`: what this machine can run, and whether the sandbox isolates."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from or1.cli import Command, app, err_console, examples, sandbox_app, user_errors
from or1.errors import UserError


@app.command(cls=Command, epilog=examples("or1 doctor"))
def doctor() -> None:
    """What this machine can run: Python, torch, CUDA, vLLM, Ray, bubblewrap, Docker, and a verdict."""
    from or1.doctor import notes, run_checks, verdict

    checks = run_checks()
    table = Table("component", "status", "found", "what it is for")
    for check in checks:
        table.add_row(
            check.name,
            "[green]ok[/green]" if check.ok else "[yellow]missing[/yellow]",
            check.found,
            check.meaning,
        )
    console = Console()
    console.print(table)
    for line in [*notes(checks), verdict(checks)]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@sandbox_app.command(
    "check", cls=Command, epilog=examples("or1 sandbox check", "or1 sandbox check --backend docker")
)
@user_errors
def sandbox_check(
    backend: Annotated[
        str, typer.Option(help="local (bubblewrap + rlimits) or docker (DOCKER_HOST engine).")
    ] = "local",
) -> None:
    """Self-test the sandbox: positive controls and hostile programs; exit 1 if any isolation check fails."""
    from or1.rewards.code import judge_probes
    from or1.sandbox.check import run_self_test

    if backend not in ("local", "docker"):
        raise UserError(f"unknown sandbox backend {backend!r}: use local or docker")
    results = run_self_test(judge_probes, backend)
    table = Table("check", "result", "detail")
    for check in results:
        table.add_row(check.name, "[green]pass[/green]" if check.passed else "[red]FAIL[/red]", check.detail)
    Console().print(table)
    failed = [c.name for c in results if not c.passed]
    if failed:
        err_console.print(
            f"[red]{len(failed)} of {len(results)} sandbox checks failed:[/red] {', '.join(failed)}"
        )
        raise typer.Exit(1)
    Console().print(f"all {len(results)} sandbox checks passed on the {backend} backend")
