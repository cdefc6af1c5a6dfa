"""`or1 train` starts Ray while a thread imports torch and the trainer: the modules the command line loads before
that must stay light (no torch, transformers or vLLM; Ray only where Ray is started), and the trainer (the
controller) must not load what only the rank processes use: transformers' model classes and FSDP (seconds)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm", "pandas", "matplotlib", "datasets")


def imported_after(statement: str, top_level: bool = True) -> set[str]:
    names = "(m for m in sys.modules if '.' not in m)" if top_level else "sys.modules"
    code = f"import sys; {statement}; print(' '.join(sorted({names})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_the_command_line_imports_neither_torch_nor_ray():
    loaded = imported_after("import or1.cli")
    assert not loaded & {*HEAVY, "ray"}, loaded & {*HEAVY, "ray"}


def test_starting_ray_imports_ray_without_torch():
    loaded = imported_after("import or1.cli, or1.hybrid.cluster")
    assert "ray" in loaded
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_the_controller_leaves_the_model_classes_to_the_ranks():
    loaded = imported_after("import or1.trainer.run", top_level=False)
    assert "torch" in loaded and "ray" in loaded
    rank_only = {
        "transformers.modeling_utils",
        "torch.distributed.fsdp",
        "or1.engines.fsdp",
        "or1.engines.fsdp_actor",
        "or1.engines.fsdp_critic",
        "or1.engines.train_settings",
    }
    assert not loaded & rank_only, loaded & rank_only


def test_the_tiny_tokenizer_leaves_the_auto_classes_alone(tiny_model_dir):
    # AutoTokenizer's module imports the Auto model classes and torch: seconds of the controller's start-up
    loaded = imported_after(
        f"from or1.tokens import load_tokenizer; load_tokenizer({str(tiny_model_dir)!r})",
        top_level=False,
    )
    assert "transformers" in loaded
    auto = {"torch", "transformers.models.auto.tokenization_auto", "transformers.models.auto.modeling_auto"}
    assert not loaded & auto, loaded & auto
