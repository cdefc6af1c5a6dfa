"""Duplicate and contamination detection on problem text: exact matches, MinHash LSH near-duplicates, n-gram overlap.

Exact duplicates compare `exact_key(text)` (case, whitespace, `$` and LaTeX spacing folded: "Find $x$." equals
"find x."); near-duplicates and contamination compare the words of `normalize(text)`, which also drops punctuation. Near-duplicates use `datasketch`'s MinHash LSH
over word shingles (Jaccard similarity above the threshold); decontamination flags a problem whose shared word
n-grams with an evaluation problem cover enough of that problem's distinctive words (`ContaminationIndex`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable

from or1.data.converters import CODE_CALL_INSTRUCTIONS, CODE_STDIN_INSTRUCTIONS, MATH_SUFFIX

# Instructions that adapters and benchmark converters append: never evidence that two problems are the same.
_BOILERPLATE = [MATH_SUFFIX, CODE_STDIN_INSTRUCTIONS, CODE_CALL_INSTRUCTIONS.split("{starter}")[0]]
_LATEX_SPACING = re.compile(r"\\[,;:! ]|\\(left|right|displaystyle|text|mathrm|quad|qquad)\b")
_NON_WORD = re.compile(r"[^\w+\-*/=<>^.]+")


def normalize(text: str) -> str:
    """Problem text folded for comparison (see the module docstring)."""
    for phrase in _BOILERPLATE:
        text = text.replace(phrase.strip(), " ")
    text = unicodedata.normalize("NFKC", text).lower().replace("$", "")
    text = _LATEX_SPACING.sub(" ", text)
    text = _NON_WORD.sub(" ", text)
    return " ".join(text.replace(" .", " ").split()).strip(" .")


def exact_key(text: str) -> str:
    """Text folded only where folding cannot change the problem: case, whitespace, `$` and LaTeX spacing."""
    for phrase in _BOILERPLATE:
        text = text.replace(phrase.strip(), " ")
    text = _LATEX_SPACING.sub(" ", unicodedata.normalize("NFKC", text).lower().replace("$", ""))
    return " ".join(text.split())


def words(text: str) -> list[str]:
    return normalize(text).split()


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    """Word n-grams; a text shorter than n words is one n-gram of all its words (short problems still match)."""
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class NearDuplicates:
    """An LSH index of problems seen so far; `add` returns the key of an earlier near-duplicate, or None."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, shingle: int = 3, seed: int = 1):
        from datasketch import MinHash, MinHashLSH

        self._minhash = MinHash
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self.num_perm, self.shingle, self.seed = num_perm, shingle, seed

    def add(self, key: str, text: str) -> str | None:
        signature = self._minhash(num_perm=self.num_perm, seed=self.seed)
        for gram in ngrams(words(text), self.shingle):
            signature.update(" ".join(gram).encode())
        earlier = self._lsh.query(signature)
        if earlier:
            return sorted(earlier)[0]
        self._lsh.insert(key, signature)
        return None


class ContaminationIndex:
    """The word n-grams and normalised texts of evaluation problems; `match` names the one a problem overlaps.

    Shared n-grams alone flag stock competition phrasing ("m and n are relatively prime positive integers. Find
    m+n"), so an overlap counts only when the words it covers carry enough of what is distinctive in the evaluation
    problem: its numbers, expressions and words rare across the evaluation set and the `background` texts (the
    training problems), each weighed by its rarity (IDF).
    An overlap is contamination when that weight is at least `min_share` of the evaluation problem's own
    distinctive weight and at least `min_weight` (or, for a problem with little of its own, half of it).
    """

    def __init__(
        self,
        named_texts: Iterable[tuple[str, str]],
        n: int = 13,
        common: int = 3,
        min_weight: float = 8.0,
        min_share: float = 0.2,
        background: Iterable[str] = (),
    ):
        self.n, self.min_weight, self.min_share = n, min_weight, min_share
        self.exact: dict[str, str] = {}
        texts: dict[str, list[str]] = {}
        owners: dict[tuple[str, ...], list[str]] = {}
        counts: Counter[tuple[str, ...]] = Counter()
        for name, text in named_texts:
            self.exact.setdefault(normalize(text), name)
            tokens = texts.setdefault(name, words(text))
            grams = ngrams(tokens, n)
            counts.update(grams)
            for gram in grams:
                owners.setdefault(gram, []).append(name)
        # an n-gram found in `common` or more evaluation problems is shared phrasing, not one problem's text
        self.grams = {g: names for g, names in owners.items() if counts[g] < common}
        # rarity is counted over the evaluation problems and `background` (the training problems being checked):
        # phrasing common in competition text is common there too
        frequency: Counter[str] = Counter(t for tokens in texts.values() for t in _terms(tokens))
        total = len(texts)
        for other in background:
            frequency.update(_terms(words(other)))
            total += 1
        total = max(total, 1)
        terms = {t for tokens in texts.values() for t in _terms(tokens)}
        self.weight = {t: _distinctive(t, frequency[t], total) for t in terms}
        self.own = {name: self._weigh(tokens) for name, tokens in texts.items()}

    def __len__(self) -> int:
        return len(self.exact)

    def match(self, text: str) -> str | None:
        """The name of an evaluation problem that `text` equals or overlaps distinctively (see the class), else
        None."""
        found = self.overlap(text)
        return found[0] if found else None

    def overlap(self, text: str) -> tuple[str, str] | None:
        """(evaluation problem, the shared words) of the strongest distinctive overlap of `text`, else None."""
        exact = self.exact.get(normalize(text))
        if exact is not None:
            return exact, "the same text"
        tokens = words(text)
        shared: dict[str, set[str]] = {}
        for gram in ngrams(tokens, self.n):
            for name in self.grams.get(gram, ()):
                shared.setdefault(name, set()).update(gram)
        best: tuple[float, str, set[str]] | None = None
        for name, covered in shared.items():
            weight, own = self._weigh(covered), self.own[name]
            enough = weight >= self.min_share * own and weight >= min(self.min_weight, own / 2)
            if enough and weight > 0 and (best is None or weight > best[0]):
                best = (weight, name, covered)
        if best is None:
            return None
        telling = [t for t in dict.fromkeys(tokens) if t in best[2] and self.weight.get(t.rstrip("."), 0) > 0]
        return best[1], " ".join(telling)

    def _weigh(self, tokens: Iterable[str]) -> float:
        return sum(self.weight.get(t, 0.0) for t in _terms(tokens))


def _terms(tokens: Iterable[str]) -> set[str]:
    """The distinct words of `tokens`, a sentence's full stop dropped ("m+n." is "m+n")."""
    return {t.rstrip(".") for t in tokens} - {""}


def _distinctive(token: str, frequency: int, total: int) -> float:
    """How much a shared word says two problems are the same: its rarity across the evaluation problems (IDF),
    doubled for numbers and expressions; words in a tenth or more of (at least three) problems say nothing."""
    if frequency >= 3 and frequency * 10 >= total:
        return 0.0
    rarity = math.log(total / frequency)
    return rarity * (2.0 if any(c.isdigit() or c in "+-*/=<>^" for c in token) else 1.0)
