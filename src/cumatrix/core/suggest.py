""""Did you mean …?" for a matrix file: edit distance over the whole token, each axis with its
own vocabulary.

``difflib``'s ratio compares shared blocks, so ``emulatd-12.8`` was closer to
``emulated-12.4`` than to ``emulated-12.8``: the version, the part that matters, weighed least.
Here a driver is compared whole against every ``emulated-X.Y`` a known runtime has headers
for, a header version by numeric distance to the known ones, and an outcome against the
outcome words with the user's own argument kept (``exti:1`` -> ``exit:1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Outcome words that take no argument.
BARE_OUTCOMES = ("ok", "ok:batch", "ok:fallback", "ok:kernel", "ok:n/a", "build-error", "timeout",
                 "cannot-emulate", "refused", "harness-error", "fails")
#: Outcome words of the form ``WORD:ARG``; the argument is the user's.
ARG_OUTCOMES = ("cuda-error", "undefined-symbol", "crash", "exit", "skipped", "runtime-leak")


def edit_distance(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of
    two neighbours (``exti`` -> ``exit`` is one edit, as a typist sees it)."""
    if a == b:
        return 0
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def _limit(word: str) -> int:
    """How many edits still read as a typo of ``word`` rather than another word."""
    n = len(word)
    return 1 if n <= 4 else 2 if n <= 8 else 3


def closest(word: str, choices: Iterable[str]) -> list[str]:
    """The choices nearest ``word`` by :func:`edit_distance` (ties all kept, in order), within
    a typo's reach; empty when none is."""
    best: list[str] = []
    best_d = _limit(word) + 1
    lowered = word.lower()
    for c in dict.fromkeys(choices):
        d = edit_distance(lowered, c.lower())
        if d < best_d:
            best, best_d = [c], d
        elif d == best_d:
            best.append(c)
    return best


def hint(choices: Sequence[str]) -> str:
    """``" (did you mean 'a'?)"``, ``" (did you mean 'a' or 'b'?)"``, or ``""``."""
    if not choices:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in choices[:3])}?)"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The hint for ``word`` among ``choices`` by whole-token edit distance."""
    return hint(closest(word, choices))


def driver_hint(text: str, versions: Iterable[str]) -> str:
    """For an unknown driver: ``host`` or ``emulated-X.Y`` for each header version known."""
    return did_you_mean(text, ["host", *(f"emulated-{v}" for v in versions)])


def _version_key(v: str) -> tuple[int, int] | None:
    parts = v.split(".")
    # isdigit() alone lets through what int() refuses: 5,000 digits, or a superscript two.
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def version_hint(text: str, known: Iterable[str]) -> str:
    """For a version that does not exist: a known version one keystroke away when there is
    exactly one (12.44 -> 12.4: by number 12.44 lies nearer 12.9, which no typist meant), else
    the known versions nearest by number (same major first: 12.7 -> 12.6 or 12.8), else by
    edit distance."""
    want = _version_key(text)
    keyed = [(k, _version_key(k)) for k in known]
    if want is None:
        return did_you_mean(text, [k for k, _ in keyed])
    typo = [k for k, _ in keyed if edit_distance(text, k) == 1]
    if len(typo) == 1:
        return hint(typo)
    return hint(_nearest_by_number(want, keyed))


def _nearest_by_number(want: tuple[int, int],
                       keyed: list[tuple[str, tuple[int, int] | None]]) -> list[str]:
    """The versions of ``keyed`` nearest ``want`` by number, those of its major if any."""
    numbered = [(k, v) for k, v in keyed if v is not None]
    pool = [(k, v) for k, v in numbered if v[0] == want[0]] or numbered
    if not pool:
        return []
    d = min(_distance(v, want) for _, v in pool)
    return [k for k, v in pool if _distance(v, want) == d]


def _distance(a: tuple[int, int], b: tuple[int, int]) -> int:
    return abs((a[0] * 1000 + a[1] * 10) - (b[0] * 1000 + b[1] * 10))


def outcome_hint(word: str) -> str:
    """For a word that is not an outcome: the outcome words, each with the user's argument."""
    _, sep, arg = word.partition(":")
    candidates = list(BARE_OUTCOMES)
    if sep and arg:
        candidates += [f"{p}:{arg}" for p in ARG_OUTCOMES]
    else:
        candidates += [f"{p}:" for p in ARG_OUTCOMES]
    return did_you_mean(word, candidates)
