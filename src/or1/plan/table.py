"""The plan as a person reads it: one table per stage (phases as rows, parts in GiB at the worst case, the peak at
the worst case and at the expected lengths), host memory, a verdict, the fix."""

from __future__ import annotations

from or1.plan.advice import Advice
from or1.plan.memory import GIB
from or1.plan.stage import WARN_SHARE, StagePlan

# the parts shown as columns, in this order (a phase leaves out those it does not have)
COLUMNS = (
    "params",
    "grads",
    "adam",
    "actor",
    "gathered",
    "activations",
    "backward",
    "vllm",
    "vllm weights",
    "vllm workspace",
    "kv cache",
    "critic",
    "ref",
    "graphs",
    "fragmentation",
    "context",
    "nccl",
)


def gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def format_stage(plan: StagePlan, advice: Advice | None) -> str:
    """The stage's table, its notes and verdict, and (when it does not fit) the smallest change that does."""
    columns = [c for c in COLUMNS if any(c in p.parts for p in plan.phases)]
    header = ["phase", *columns, "worst GiB", "expected GiB"]
    rows = [
        [
            p.name,
            *(gib(p.parts[c]) if c in p.parts else "-" for c in columns),
            gib(p.peak),
            gib(p.expected_peak),
        ]
        for p in plan.phases
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"stage {plan.stage} on {plan.device.label}: {plan.settings}"]
    for row in [header, *rows]:
        lines.append(
            "  "
            + "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if plan.lengths:
        lines.append(f"  lengths: {plan.lengths}")
    lines += [f"  {note}" for note in plan.notes]
    if plan.host is not None:
        kept = ", ".join(f"{name} {gib(n)}" for name, n in plan.host.parts.items()) or "nothing"
        of = f" of {gib(plan.device.host)}" if plan.device.host is not None else ""
        lines.append(
            f"  host memory per node: {gib(plan.host.peak)}{of} GiB (loading {gib(plan.host.load)}; while "
            f"training {gib(plan.host.training)}: {kept})"
        )
    peak, expected = plan.peak, plan.expected_peak
    verdict = "DOES NOT FIT" if not plan.fits else "fits, TIGHT" if plan.tight else "fits"
    lines.append(
        f"  {verdict}: peak {gib(expected.expected_peak)} GiB ({expected.name}) at the expected lengths, "
        f"{gib(peak.peak)} GiB ({peak.name}) at the worst case, of {gib(plan.device.memory)} GiB per GPU"
        + (f"; {_why_tight(plan)}" if plan.tight else "")
    )
    lines += [f"  problem: {problem}" for problem in plan.problems]
    if not plan.fits:
        if advice is None:
            lines.append(
                "  no change tried fits (token budget, checkpointing, SP, TP, offload, up to 4x the nodes)"
            )
        else:
            after = advice.plan.expected_peak
            lines.append(
                f"  smallest change that fits: --set {' --set '.join(advice.sets)} "
                f"(peak {gib(after.expected_peak)} GiB, {after.name})"
            )
    return "\n".join(lines)


def _why_tight(plan: StagePlan) -> str:
    if not plan.worst_fits:
        return "a step whose responses all run to the budget would not fit (a token budget bounds it)"
    return f"above {WARN_SHARE:.0%}: little room for what the plan does not count"


def tight_line(plan: StagePlan) -> str:
    """The pre-flight's warning for a stage that fits above the warning band, or only at the expected lengths."""
    if not plan.worst_fits:
        peak, expected = plan.peak, plan.expected_peak
        return (
            f"stage {plan.stage} fits at the expected response lengths ({expected.name} "
            f"{gib(expected.expected_peak)} GiB per GPU) but not at the worst case: its {peak.name} phase needs "
            f"{gib(peak.peak)} of {gib(plan.device.memory)} GiB when every response runs to the budget; a token "
            "budget (actor.max_tokens_per_micro_batch) bounds it: see `or1 plan`"
        )
    peak = plan.expected_peak
    need = peak.expected_peak
    return (
        f"stage {plan.stage} fits with little to spare: its {peak.name} phase needs {gib(need)} of "
        f"{gib(plan.device.memory)} GiB per GPU ({need / plan.device.memory:.0%}, above {WARN_SHARE:.0%}); "
        "allocator fragmentation can tip it over: see `or1 plan` for the settings that lower it"
    )


def one_line(plan: StagePlan, advice: Advice | None) -> str:
    """Why a stage cannot start, with the numbers and the fix, in one sentence (or1 train's refusal)."""
    peak = plan.expected_peak
    need, memory = gib(peak.expected_peak), gib(plan.device.memory)
    if (
        peak.expected_peak <= plan.device.memory
    ):  # the GPU holds it: what stops it is a problem (vLLM, host memory)
        what = "will not fit"
        reason = f"{'; '.join(plan.problems)} (its {peak.name} phase needs {need} of {memory} GiB per GPU)"
    else:
        what = "will not fit in GPU memory"
        reason = f"its {peak.name} phase needs {need} GiB per GPU of {memory} GiB"
        if plan.problems:
            reason += f", and {plan.problems[0]}"
    fix = f"pass --set {' --set '.join(advice.sets)}" if advice else "no setting tried makes it fit"
    return (
        f"stage {plan.stage} {what}: {reason} ({plan.settings}); {fix}, see `or1 plan`, "
        "or pass --no-plan-check to start anyway"
    )
