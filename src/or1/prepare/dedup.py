"""Duplicate and contamination detection on problem text: exact matches, MinHash LSH near-duplicates, n-gram overlap.

Exact duplicates compare `exact_key(text)` (case, whitespace, `$` and LaTeX spacing folded: "Find $x$." equals
"find x."); near-duplicates and contamination compare the words of `normalize(text)`, which also drops punctuation. Near-duplicates use `datasketch`'s MinHash LSH
over word shingles (Jaccard similarity above the threshold); decontamination flags a problem that shares any word
n-gram with an evaluation problem, ignoring n-grams that occur in many evaluation problems (shared instructions).
"""

from __future__ import annotations

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
    """The word n-grams and normalised texts of evaluation problems; `match` names the one a problem overlaps."""

    def __init__(self, named_texts: Iterable[tuple[str, str]], n: int = 13, common: int = 3):
        self.n = n
        self.exact: dict[str, str] = {}
        owners: dict[tuple[str, ...], str] = {}
        counts: Counter[tuple[str, ...]] = Counter()
        for name, text in named_texts:
            self.exact.setdefault(normalize(text), name)
            grams = ngrams(words(text), n)
            counts.update(grams)
            for gram in grams:
                owners.setdefault(gram, name)
        # an n-gram found in `common` or more evaluation problems is shared phrasing, not one problem's text
        self.grams = {g: owner for g, owner in owners.items() if counts[g] < common}

    def __len__(self) -> int:
        return len(self.exact)

    def match(self, text: str) -> str | None:
        """The name of an evaluation problem that `text` equals or shares an n-gram with, else None."""
        exact = self.exact.get(normalize(text))
        if exact is not None:
            return exact
        for gram in ngrams(words(text), self.n):
            if gram in self.grams:
                return self.grams[gram]
        return None
