"""One place for the errors cumatrix raises on purpose.

Every error carries the exit code the CLI returns for it and a message that says what
happened, where (``file:line:col`` when there is a place), and how to fix it.

Exit codes of every ``cumatrix`` command:

* **0**: at least one cell was tested (ran the code under test and was judged) and every tested
  cell met its expectation (or the command did what it was asked);
* **1**: some cell did not meet its expectation (the code under test, not the harness), or its
  record was refused: ``harness-error``, a record of ``results.jsonl`` that the run did not write
  as it stands (edited, put back from another run, or taken out); ``merge``: a host of the plan
  left cells unrun;
* **2**: bad input or usage: a matrix file, a catalog, a command-line value, an ``--out``
  that another run holds (:class:`ConfigError`, :class:`UsageError`, :class:`OutDirBusy`);
* **3**: the run cannot happen here: an environment problem found before any cell
  (``--out`` unwritable, a file, or on a full filesystem; a missing compiler or base
  image: :class:`EnvironmentProblem`) or a failure of cumatrix itself (:class:`HarnessError`);
* **5**: nothing tested: ``cumatrix run`` selected no cell (``-k`` matched none), or every cell
  of a run (or a merge) was skipped or not run (no GPU, ...), a cell skipped after its process
  ran included: the verdict is ``NOTHING TESTED``, never a pass; pytest's code for "no tests
  collected".  ``--allow-empty`` turns it into 0.

* **141**: standard output's reader went away (a closed pipe), as a shell reports SIGPIPE.

An error cumatrix did not foresee is a failure of cumatrix itself: exit 3, one line
(``CUMATRIX_TRACEBACK=1`` shows the traceback), never 1.

``cumatrix repro --bug`` exits 3 when this host cannot run the entry (no GPU, an older driver):
it writes the report's skeleton and the command to run on a host that can.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cumatrix.core.suggest import did_you_mean as _nearest

#: Exit code of a run in which nothing was tested: no cell selected, or every cell skipped or not run.
EXIT_NOTHING_RAN = 5


class CumatrixError(Exception):
    """Base of every error cumatrix raises deliberately."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Problem:
    """One validation problem at a place in a file."""

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class ConfigError(CumatrixError):
    """Bad input: a matrix file, a command-line value, a results file.

    Holds one or more :class:`Problem`; ``str()`` gives one line per problem.
    """

    def __init__(self, problems: Iterable[Problem] | str) -> None:
        if isinstance(problems, str):
            self.problems: tuple[Problem, ...] = ()
            text = problems
        else:
            # In the order a reader goes through the file (and files in name order).
            self.problems = tuple(sorted(problems, key=lambda p: (p.file, p.line, p.col)))
            text = "\n".join(str(p) for p in self.problems)
        super().__init__(text)


class UsageError(CumatrixError):
    """The command line asks for something that cannot be done."""


class RuntimeNotFound(CumatrixError):
    """A runtime requirement did not resolve to a wheel."""


class DaemonUnavailable(CumatrixError):
    """No Docker daemon answers."""


class OutDirBusy(UsageError):
    """Another run holds the ``--out`` directory (exit 2): the message names its pid and command."""


class HarnessError(CumatrixError):
    """cumatrix itself failed; not the code under test."""

    exit_code = 3


class EnvironmentProblem(HarnessError):
    """This machine cannot run the matrix as asked (exit 3), found before any cell runs.

    An ``--out`` that is a file, cannot be created or written, or sits on a full
    filesystem; a missing compiler or base image.  One message, no traceback.
    """


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choice by edit distance over the
    whole word (ties: each of them), or ``""`` when none is within a typo's reach."""
    return _nearest(word, choices)


class UnsafeArchive(CumatrixError):
    """A wheel holds a member that would land outside its target or is not a plain file."""
