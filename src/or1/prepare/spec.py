"""The data spec: a small YAML file naming the sources and the cleaning and difficulty steps (data/README.md).

Every key is a typed, documented field with a default; an unknown key or a bad value is one line naming the file
and the key. Relative paths are relative to the working directory, as in the training recipes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from or1.errors import UserError
from or1.prepare.verifiable import RULES

SPECS_DIR = Path(__file__).resolve().parents[3] / "data"
SYNTHETIC = ("tiny-math-train", "tiny-math-validation", "tiny-code-train", "tiny-code-validation")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceSpec(_Section):
    """One input: a local file (`path`), a hub dataset (`hub`, `config`, `split`) or a synthetic tiny split."""

    name: str = Field(description="Short name; the report and dropped.jsonl count and trace rows by it.")
    path: str | None = Field(
        None, description="A local .parquet, .jsonl or .json file (also gzipped: .jsonl.gz, .json.gz)."
    )
    hub: str | None = Field(
        None, description="A hub dataset id, loaded with `datasets` (HF cache, offline mode)."
    )
    config: str | None = Field(None, description="The hub dataset's configuration (subset) name.")
    split: str = Field("train", description="The hub dataset's split.")
    synthetic: Literal[SYNTHETIC] | None = Field(None, description="A synthetic split of the tiny world.")  # type: ignore[valid-type]
    size: int | None = Field(None, ge=1, description="Synthetic train splits: how many tasks.")
    seed: int = Field(0, description="Synthetic train splits: the generator seed.")
    ops: list[int] | None = Field(
        None,
        description="tiny-math-train: the operand counts (2-8), balanced over the list; None: 3..6. 2-operand "
        "problems are short answers (12 tokens), 6-operand ones long (44).",
    )
    adapter: str = Field(
        "auto", description="Schema adapter (or1, deepscaler, numina, ...); auto: by the keys."
    )
    ability: Literal["math", "code"] | None = Field(
        None, description="For `adapter: benchmark`: math or code."
    )
    role: Literal["train", "validation"] = Field("train", description="Which split the kept rows join.")
    output: str | None = Field(None, description="Output file stem (default: the role): <output>.parquet.")
    data_source: str | None = Field(None, description="The rows' data_source (default: <role>-<name>).")
    select: dict[str, list[Any]] = Field(
        default_factory=dict, description="Keep only raw records whose field is one of the values."
    )
    limit: int | None = Field(None, ge=1, description="Read at most this many records (the first ones).")
    grade: bool = Field(True, description="Train rows of this source go through the difficulty step.")
    allow_empty: bool = Field(
        False, description="The source may hold no records: a warning instead of an error (exit 2)."
    )

    @model_validator(mode="after")
    def _one_origin(self) -> SourceSpec:
        given = [k for k in ("path", "hub", "synthetic") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                f"source {self.name!r} needs exactly one of path, hub or synthetic (got {given})"
            )
        from or1.prepare.adapters import ADAPTERS

        if self.adapter != "auto" and self.adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {self.adapter!r}; choose auto or one of {', '.join(ADAPTERS)}")
        return self


class DedupSpec(_Section):
    """Exact duplicates always (when enabled); near-duplicates by MinHash LSH over word shingles."""

    enabled: bool = True
    near: bool = Field(True, description="Also drop near-duplicates (Jaccard similarity above threshold).")
    threshold: float = Field(0.8, gt=0, lt=1, description="MinHash LSH Jaccard threshold.")
    num_perm: int = Field(128, ge=16, description="MinHash permutations.")
    shingle: int = Field(3, ge=1, description="Words per shingle.")


class DecontaminateSpec(_Section):
    """Drop train problems that share a word n-gram with an evaluation problem."""

    enabled: bool = True
    benchmarks: list[str] = Field(
        default_factory=lambda: ["aime24", "aime25", "math500", "amc", "livecodebench"],
        description="Registry names of `or1 eval` benchmarks (their shared files, else the hub).",
    )
    files: list[str] = Field(
        default_factory=list, description="More evaluation files (or1 rows or known schemas)."
    )
    benchmark_dir: str | None = Field(
        None,
        description="Folder of local benchmark files (default: the OR1_BENCHMARKS folder, else the hub).",
    )
    ngram: int = Field(13, ge=3, description="Words per n-gram.")


class FiltersSpec(_Section):
    """Verifiability rules; each names a drop reason in the report."""

    enabled: bool = True
    rules: list[str] = Field(default_factory=lambda: list(RULES), description=f"Any of {', '.join(RULES)}.")

    @model_validator(mode="after")
    def _known(self) -> FiltersSpec:
        unknown = sorted(set(self.rules) - set(RULES))
        if unknown:
            raise ValueError(f"unknown rules {unknown}; choose from {', '.join(RULES)}")
        return self


class ChecksSpec(_Section):
    """Reference checks through or1's rewards."""

    math_answer: bool = Field(True, description="The reference solution's final answer must verify.")
    code_solution: bool = Field(
        True, description="The reference solution must pass its tests in the sandbox."
    )
    workers: int = Field(2, ge=1, description="Math verifier processes / sandbox slots.")
    sandbox: Literal["local", "docker"] = "local"


class DifficultySpec(_Section):
    """Sample the target model n times per train problem; keep problems solved a number of times in `keep`."""

    enabled: bool = False
    model: str = Field("", description="Model folder or hub id (resolved from the local HF cache).")
    model_name: str | None = Field(
        None, description="Key in extra_info.model_difficulty (default: folder name)."
    )
    engine: Literal["hf", "vllm"] = "hf"
    n: int = Field(16, ge=1, description="Samples per problem (the paper: 16 math, 8 code).")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(1024, ge=1)
    keep: tuple[int, int] | None = Field(None, description="Solved-count range kept (default [1, n-1]).")
    seed: int = 0
    executor: Literal["auto", "ray", "local"] = Field(
        "auto",
        description="ray: engine actors on the Ray cluster; local: in this process; auto: ray when there are "
        "several workers or a --ray-address, else local.",
    )
    workers: int = Field(1, ge=1, description="Engine actors.")
    chunk_size: int = Field(64, ge=1, description="Problems per actor call (and per cache write).")
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    reward_workers: int = Field(1, ge=1, description="Math verifier processes per actor.")
    micro_batch_size: int = Field(128, ge=1, description="Sequences per forward pass of the hf engine.")

    @model_validator(mode="after")
    def _model_given(self) -> DifficultySpec:
        if self.enabled and not self.model:
            raise ValueError("difficulty.enabled needs difficulty.model (a folder or hub id)")
        lo, hi = self.keep_range
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"difficulty.keep must satisfy 0 <= low <= high <= n={self.n}, got [{lo}, {hi}]")
        return self

    @property
    def keep_range(self) -> tuple[int, int]:
        return self.keep if self.keep is not None else (1, max(self.n - 1, 1))

    @property
    def name(self) -> str:
        return self.model_name or Path(self.model.rstrip("/")).name


class DataSpec(_Section):
    """A whole data preparation: sources in, steps in order, train / validation files out."""

    name: str
    description: str = ""
    seed: int = Field(0, description="Seed of the output row order.")
    sources: list[SourceSpec] = Field(min_length=1)
    filters: FiltersSpec = Field(default_factory=FiltersSpec)
    dedup: DedupSpec = Field(default_factory=DedupSpec)
    decontaminate: DecontaminateSpec = Field(default_factory=DecontaminateSpec)
    checks: ChecksSpec = Field(default_factory=ChecksSpec)
    difficulty: DifficultySpec = Field(default_factory=DifficultySpec)
    shuffle: bool = Field(
        True, description="Shuffle each output file's rows (by seed); false keeps source order."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> DataSpec:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        return self


def find_spec(spec: str | Path) -> Path:
    """A spec path as given, else data/<spec>.yaml of the repository."""
    path = Path(spec)
    if path.is_file():
        return path
    for candidate in (SPECS_DIR / f"{spec}.yaml", SPECS_DIR / str(spec)):
        if candidate.is_file():
            return candidate
    raise UserError(f"Data spec {spec} not found; give a YAML path or a name from {SPECS_DIR}.")


def load_spec(spec: str | Path) -> tuple[Path, DataSpec, dict[str, Any]]:
    """(path, validated spec, the raw YAML mapping) of `spec`; errors are one line naming the file and key."""
    path = find_spec(spec)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} must hold a mapping (name, sources, steps).")
    try:
        return path, DataSpec.model_validate(raw), raw
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(f"{path}: {where}: {first['msg'].removeprefix('Value error, ')}") from None
