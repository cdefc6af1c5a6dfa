"""The tiny world's base model, shipped inside or1 (the folder `tiny-base/` beside this module, 6.8 MB).

`or1 init-model --preset tiny` writes this folder, so the main command, the CI chain and the tests that train the
tiny world start from the same bits on every processor. Rebuilding it on each machine made a different model per
processor vendor: the warm start's 600 steps turn float rounding into another model, and pinning torch's and MKL's
kernels (or1.tinyworld.init) made one model across kernel choices on AMD EPYC but not on an Intel Xeon (24.4% of
arithmetic where this base solves 51.9%). `or1 init-model --rebuild` runs the warm start again (about 7 minutes) and
says whether the result is these bits and, if not, at which warm-start step the losses part.

The base was built by `or1 init-model --rebuild --out src/or1/tinyworld/tiny-base` (seed 0, 600 steps); its report,
or1_init_report.json, records the settings, the machine, the first warm-start losses, the rates and every file's
sha256, and tests/tinyworld/test_shipped_base.py fails when the base and the code that builds it drift apart.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from or1.atomic import atomic_path
from or1.errors import UserError
from or1.tinyworld.init import REPORT_FILE, InitReport, file_hashes, print_report

SHIPPED_BASE = Path(__file__).resolve().parent / "tiny-base"
SHIPPED_RECIPE = (0, 600)  # its seed and warm-start steps: init_tiny_model's defaults
# what makes two builds the same model; config.json also names the transformers version that wrote it
MODEL_FILES = ("model.safetensors", "tokenizer.json")


def shipped_report() -> InitReport:
    """The shipped base's init report, after checking that its files are the ones the report hashed."""
    report = InitReport.read(SHIPPED_BASE)
    if file_hashes(SHIPPED_BASE) != report.files:
        raise UserError(
            f"The tiny base shipped in {SHIPPED_BASE} does not match its {REPORT_FILE}; reinstall or1 or build "
            "one with `or1 init-model --rebuild`."
        )
    return report


def install_base(out: str | Path, *, overwrite: bool = False, console: Console | None = None) -> InitReport:
    """Copy the shipped base into `out` (each file written aside, then renamed) and print its report."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} already exists and is not empty; choose another --out or pass --overwrite.")
    report = shipped_report()
    out.mkdir(parents=True, exist_ok=True)
    for name in (*report.files, REPORT_FILE):
        with atomic_path(out / name) as tmp:
            shutil.copyfile(SHIPPED_BASE / name, tmp)
    console = console or Console()
    print_report(console, report, out)
    console.print(
        f"The tiny base shipped with or1 (built on {report.machine.get('cpu', 'an unrecorded CPU')}); "
        "`or1 init-model --rebuild` trains it again on this machine."
    )
    return report


# the settings that make a build the shipped base's recipe (the evaluation's do not change the model)
RECIPE_SETTINGS = ("sft_steps", "batch_size", "lr", "spec", "data_sha256")


def compare_with_shipped(built: InitReport) -> str | None:
    """One line: whether a base built with the shipped one's recipe is its bits, and where their warm starts part
    if not; None for a base of another recipe (another seed, more steps)."""
    if not (SHIPPED_BASE / REPORT_FILE).is_file():
        return None
    shipped = shipped_report()
    if built.seed != shipped.seed or any(
        built.settings.get(k) != shipped.settings[k] for k in RECIPE_SETTINGS
    ):
        return None
    if all(built.files.get(name) == shipped.files[name] for name in MODEL_FILES):
        return "Same bits as the tiny base shipped with or1."
    if built.files.get("tokenizer.json") != shipped.files["tokenizer.json"]:
        where = "their tokenizers differ (the tokenizer corpus or the tokenizers library)"
    else:
        steps = zip(built.sft.first_losses, shipped.sft.first_losses, strict=False)
        parted = next((i for i, (a, b) in enumerate(steps) if a != b), None)
        where = (
            f"the warm-start losses part at step {parted} ({built.sft.first_losses[parted]!r} here, "
            f"{shipped.sft.first_losses[parted]!r} shipped)"
            if parted is not None
            else f"the first {len(built.sft.first_losses)} warm-start losses agree, later steps part"
        )
    return (
        f"Not the shipped base's bits: {where}; the shipped one was built on {shipped.machine.get('cpu', '?')}, "
        f"base rates {shipped.solve_rate.overall:.1%} / {shipped.code_solve_rate.overall:.1%}."
    )
