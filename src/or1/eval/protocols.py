"""Named sampling protocols for evaluation, each after its source, and how explicit flags override them.

Reported numbers differ mostly by sampling settings, so a run always names a protocol and records the settings it
resolved to (RECIPE.md, Evaluation protocol):
- `skywork`: the Skywork-OR1 paper: T=1.0, top_p=1.0, 32,768 response tokens, 32 samples for math, 4 for code.
- `skywork-7b-script`: the repository's eval_7b script: as `skywork` but T=0.6.
- `deepseek-r1`: DeepSeek-R1's convention: T=0.6, top_p=0.95, 64 samples, 32,768 tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from or1.errors import UserError

MAX_RESPONSE_TOKENS = 32768


@dataclass(frozen=True)
class Protocol:
    """A named set of defaults; `n_math` / `n_code` are the sample counts per problem for each ability."""

    name: str
    temperature: float
    top_p: float
    max_tokens: int
    n_math: int
    n_code: int
    source: str


PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol(
            "skywork", 1.0, 1.0, MAX_RESPONSE_TOKENS, 32, 4, "Skywork-OR1 technical report (arXiv 2505.22312)"
        ),
        Protocol(
            "skywork-7b-script", 0.6, 1.0, MAX_RESPONSE_TOKENS, 32, 4, "SkyworkAI/Skywork-OR1 eval_7b script"
        ),
        Protocol(
            "deepseek-r1", 0.6, 0.95, MAX_RESPONSE_TOKENS, 64, 64, "DeepSeek-R1 report evaluation setup"
        ),
    )
}


@dataclass(frozen=True)
class EvalSampling:
    """The settings a run actually uses, after overrides; `overridden` lists the fields set by flags."""

    protocol: str
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    overridden: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_sampling(
    protocol: str,
    ability: str,
    *,
    seed: int,
    n: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
) -> EvalSampling:
    """The protocol's settings for `ability` ("math" or "code"), with every non-None flag taking precedence."""
    if protocol not in PROTOCOLS:
        raise UserError(f"Unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}.")
    base = PROTOCOLS[protocol]
    flags = {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
    resolved = EvalSampling(
        protocol=protocol,
        n=n if n is not None else (base.n_code if ability == "code" else base.n_math),
        temperature=temperature if temperature is not None else base.temperature,
        top_p=top_p if top_p is not None else base.top_p,
        max_tokens=max_tokens if max_tokens is not None else base.max_tokens,
        seed=seed,
        overridden=tuple(name for name, value in flags.items() if value is not None),
    )
    _check(resolved)
    return resolved


def _check(s: EvalSampling) -> None:
    if s.n < 1 or s.max_tokens < 1:
        raise UserError(f"--n and --max-tokens must be at least 1, got n={s.n}, max_tokens={s.max_tokens}.")
    if s.temperature < 0 or not 0 < s.top_p <= 1:
        raise UserError(
            f"--temperature must be >= 0 and --top-p in (0, 1], got {s.temperature} and {s.top_p}."
        )
