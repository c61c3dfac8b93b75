"""MkDocs hook: the reference pages, generated from the code at build time so they cannot drift.

Registered in ``mkdocs.yml`` (``hooks:``, MkDocs >= 1.6).  It adds three pages that exist
only in the built site:

- ``reference/matrix.md``: the matrix file, from the JSON Schema the package ships
  (``cumatrix/data/matrix.schema.json``, the one ``cumatrix validate`` checks);
- ``reference/cli.md``: every command's ``--help``, from the CLI's own argparse parser;
- ``reference/outcomes.md``: the outcome words (``Kind``) and the exit codes (the error classes).

It also publishes the repository files the pages link to outside ``docs/`` (the committed
reports under ``reports/``, ``reference/README.md``, benchmark scripts) under ``repo/`` in
the site, and rewrites those links to match, so that a link works both on the repository's
web view and in the built site.  A link to a directory gets a generated listing page.

Nothing here imports MkDocs at module level: ``tests/unit/test_docs.py`` imports the
page builders without it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import posixpath
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
SCHEMA = ROOT / "src" / "cumatrix" / "data" / "matrix.schema.json"

#: Pages this hook generates (paths relative to docs/): links to them resolve in the site.
GENERATED = ("reference/matrix.md", "reference/cli.md", "reference/outcomes.md")
#: Where repository files outside docs/ appear in the site.
REPO_PREFIX = "repo"

log = logging.getLogger("mkdocs.hooks.gen_ref")  # under "mkdocs": --strict counts its warnings


def _import_first(*names: str) -> Any:
    """The first of ``names`` that imports (modules move between stage packages)."""
    if str(ROOT / "src") not in sys.path:
        try:
            importlib.import_module("cumatrix")
        except ImportError:  # a docs build from a checkout without the package installed
            sys.path.insert(0, str(ROOT / "src"))
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise ImportError("none of these imports: " + "; ".join(errors))


def _rst_to_md(text: str) -> str:
    """The few reStructuredText roles the package's docstrings use, as Markdown."""
    text = re.sub(r":(?:class|func|meth|mod|attr|data):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


# --------------------------------------------------------------------------- matrix file


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type_of(node: dict[str, Any]) -> str:
    """One cell of the reference table: what a value may be."""
    if "$ref" in node:
        name = _ref_name(node["$ref"])
        return f"[{name}](#{name.lower()})"
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    types = node.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    parts = []
    for t in types:
        if t == "array":
            items = node.get("items")
            inner = _type_of(items) if items else ""
            parts.append(f"list of ({inner})" if " or " in inner else f"list of {inner}" if inner else "list")
        elif t == "object" and isinstance(node.get("additionalProperties"), dict):
            keys = _type_of(node["propertyNames"]) if "propertyNames" in node else "string"
            parts.append(f"mapping of {keys} to {_type_of(node['additionalProperties'])}")
        elif t == "object" and node.get("properties"):
            parts.append("mapping (keys below)")
        else:
            parts.append(t)
    return " or ".join(parts) or "any"


_CONSTRAINTS = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maxLength", "at most {} characters"),
                ("minItems", "at least {} item(s)"), ("minProperties", "at least {} key(s)"),
                ("pattern", "matches `{}`"))


def _visible(text: str) -> str:
    """Control characters (the schema's patterns exclude NUL) written as JSON escapes."""
    return re.sub(r"[\x00-\x1f]", lambda m: f"\\u{ord(m.group()):04x}", text)


def _constraints(node: dict[str, Any]) -> str:
    out = [_visible(fmt.format(node[k])) for k, fmt in _CONSTRAINTS if k in node]
    if "examples" in node:
        out.append("e.g. " + ", ".join(f"`{json.dumps(e) if not isinstance(e, str) else e}`"
                                       for e in node["examples"]))
    return "; ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _keys_table(node: dict[str, Any]) -> list[str]:
    required = set(node.get("required", ()))
    rows = ["| key | required | value | constraints | meaning |", "|---|---|---|---|---|"]
    for key, sub in node.get("properties", {}).items():
        meaning = sub.get("description") or sub.get("errorMessage") or ""
        rows.append(f"| `{key}` | {'yes' if key in required else ''} | {_cell(_type_of(sub))} | "
                    f"{_cell(_constraints(sub))} | {_cell(meaning)} |")
    return rows


def matrix_reference(schema_path: Path = SCHEMA) -> str:
    """The matrix file reference page, from the package's JSON Schema."""
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    lines = [
        "# Matrix file reference",
        "",
        "Generated from the JSON Schema the package ships, `cumatrix/data/matrix.schema.json` "
        "(what `cumatrix validate` checks first, and what editors complete from): this page "
        "cannot say anything the schema does not. What a schema cannot say (header versions "
        "with no wheel, selectors that match no cell, duplicate names) is checked by "
        "`cumatrix validate` afterwards; [Writing a matrix](../matrix.md) explains the file, and "
        "[Outcomes and exit codes](outcomes.md) the words `expect:` takes.",
        "",
        f"**{schema.get('title', 'matrix file')}.** {schema.get('description', '')}",
        "",
        "## Top-level keys",
        "",
        *_keys_table(schema),
        "",
        "A key not listed here is an error (with a *did you mean* where one is close).",
    ]
    for name, node in schema.get("$defs", {}).items():
        lines += ["", f"## {name}", ""]
        if node.get("description"):
            lines += [node["description"], ""]
        if node.get("properties"):
            lines += [f"A mapping; {_type_of({'type': 'object', **node}) if 'additionalProperties' in node and isinstance(node['additionalProperties'], dict) else 'only these keys'}:", ""]
            lines += _keys_table(node)
        else:
            lines.append(f"Value: {_type_of(node)}.")
            if _constraints(node):
                lines.append(f"Constraints: {_constraints(node)}.")
        if node.get("errorMessage"):
            lines += ["", f"Expected, in the words of a validation error: *{node['errorMessage']}*."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI


def cli_parser() -> argparse.ArgumentParser:
    """The ``cumatrix`` parser with every command, from wherever the CLI module lives."""
    cli = _import_first("cumatrix.front.cli", "cumatrix.cli")
    return cli.parser()


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _helps(p: argparse.ArgumentParser) -> dict[str, str]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def cli_reference() -> str:
    """The command-line reference page: every command's ``--help``, as argparse prints it."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: a fixed width, a stable page
    try:
        top = cli_parser()
        lines = [
            "# Command-line reference",
            "",
            "Generated from the `cumatrix` command's own argparse parser: each section is what "
            "`cumatrix COMMAND --help` prints. Exit codes: [Outcomes and exit codes](outcomes.md).",
            "",
            "| command | what it does |",
            "|---|---|",
        ]
        subs, helps = _subcommands(top), _helps(top)
        lines += [f"| [`{name}`](#cumatrix-{name}) | {_cell(helps.get(name, ''))} |" for name in subs]
        lines += ["", "## cumatrix", "", "```text", top.format_help().rstrip(), "```"]
        for name, sub in subs.items():
            lines += ["", f"## cumatrix {name}", "", "```text", sub.format_help().rstrip(), "```"]
        return "\n".join(lines) + "\n"
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# --------------------------------------------------------------------------- outcomes, exit codes

#: What each outcome word means.  Keyed by the ``Kind`` enum's values: a word added to or
#: removed from the code without this table changing fails the docs build.
OUTCOME_MEANINGS = {
    "ok": "The cell did what it was run for. `path` says how a swap moved its blocks: `batch`, "
          "`fallback` (one copy per block), `kernel` (the copy kernel) or `n/a` (probes and commands). "
          "An expectation of `ok:PATH` admits only that path.",
    "cuda-error": "`cuda-error:N`: a CUDA call returned error N (the record carries the error's name).",
    "undefined-symbol": "`undefined-symbol:SYM`: the dynamic loader could not resolve SYM (a binary linked an "
                        "entry point the driver or runtime does not have).",
    "build-error": "A reference variant did not compile against the cell's headers (the compiler's message "
                   "is the detail).",
    "crash": "`crash:SIGNAME`: the process died of a signal (`crash:SIGSEGV`, `crash:SIGABRT`).",
    "exit": "`exit:N`: a command exited non-zero on its own.",
    "timeout": "The cell ran past its timeout and was killed with its whole process tree.",
    "cannot-emulate": "An emulated driver cannot stand for this pairing (a CUDA 12 runtime detects the "
                      "interposer): neither pass nor fail. Reached only by a program that succeeded, or by "
                      "the interposer's own signature (error 103 from a harness child); any other failure "
                      "keeps its outcome and is judged.",
    "refused": "The container toolkit refused to start the image (its `NVIDIA_REQUIRE_CUDA` is not met).",
    "skipped": "`skipped:REASON`: the cell did not run here (`skipped:no-cuda-driver`, "
               "`skipped:needs-docker`, `skipped:no-compiler`, ...), or ran and did not test its pairing "
               "(`skipped:runtime-not-used`: a program that succeeded with a runtime not the cell's): "
               "neither pass nor fail. A program that failed is never a skip.",
    "harness-error": "cumatrix itself failed for this cell (a sandbox that was asked for and is missing, a "
                     "malformed verdict): not the code under test.",
    "fails": "Expected only: the program fails, however it reports it (any non-zero exit, a signal, a CUDA "
             "error, an undefined symbol; not a timeout). What a rule predicts where NVIDIA's says a program "
             "fails but not how.",
    "runtime-leak": "`runtime-leak:PATH`: the process used the CUDA runtime at PATH, from outside both its own "
                    "distribution and the cell (a host toolkit, the loader cache, an `LD_LIBRARY_PATH` entry the "
                    "harness did not set, another environment's wheel): a failure, whose detail says how the "
                    "loader found it. A case's `allow_runtime` names host runtimes used on purpose. See "
                    "[Where the runtime came from](../tutorial-runtimes.md).",
}


def _model() -> Any:
    return _import_first("cumatrix.core.model", "cumatrix.model")


def _errors() -> Any:
    return _import_first("cumatrix.core.errors", "cumatrix.errors")


def _judge_rules() -> str | None:
    """The judge's rules, from the docstring of the module that applies them."""
    for name in ("cumatrix.judge.verdict", "cumatrix.judge"):
        try:
            doc = importlib.import_module(name).__doc__ or ""
        except ImportError:
            continue
        if "The rules, in order:" in doc:
            return doc.split("The rules, in order:", 1)[1].strip()
    return None


def _error_classes(errors: Any) -> Iterator[tuple[str, int, str]]:
    base = errors.CumatrixError
    for name, obj in vars(errors).items():
        if inspect.isclass(obj) and issubclass(obj, base):
            doc = inspect.getdoc(obj) or ""
            yield name, int(obj.exit_code), doc.split("\n\n", 1)[0].replace("\n", " ")


def outcomes_reference() -> str:
    """The outcome words and the exit codes, from the code that defines them."""
    model, errors = _model(), _errors()
    words = [k.value for k in model.Kind]
    missing = [w for w in words if w not in OUTCOME_MEANINGS]
    stale = [w for w in OUTCOME_MEANINGS if w not in words]
    if missing or stale:
        raise RuntimeError(f"docs/gen_ref.py OUTCOME_MEANINGS is out of date: words without a meaning "
                           f"{missing}, meanings of no word {stale}")
    neutral = [w for w in words if model.is_neutral(w if w != "skipped" else "skipped:x")]
    lines = [
        "# Outcomes and exit codes",
        "",
        "Generated from the code that defines them (the outcome kinds of the model, the judge's "
        "rules, the error classes).",
        "",
        "## Outcome words",
        "",
        "Observed and expected outcomes use the same words; an `expect:` entry takes one word or a "
        "list, and a cell passes when what it did is in its expected set.",
        "",
        "| word | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{w}` | {_cell(OUTCOME_MEANINGS[w])} |" for w in words]
    lines += [
        "",
        f"Paths of `ok`: {', '.join(f'`{p}`' for p in model.PATHS)}.",
        "",
        "Neither pass nor fail (reported as skipped): " + ", ".join(f"`{w}`" for w in neutral)
        + ", and `not-run` (a planned cell no host ran). **Only a cell whose program did not fail can "
        "be neutral**: a cell whose process exited non-zero, died on a signal, timed out or reported an "
        "error is judged against its prediction, whatever runtime it used; that the cell's runtime was "
        "not used stays a fact on its record (`fingerprint.runtime_not_used`) and in every report. A "
        "skip says the pairing was not tested, never that a failure did not count.",
        "",
        f"An expectation may also say `{getattr(model, 'FAILS', 'fails')}`: the program fails, in a way "
        "no rule says (any non-zero exit, a signal, a CUDA error, an undefined symbol; not a timeout). "
        "It is what a rule predicts where NVIDIA's says a program fails but not how it reports it "
        "(a program's CUDA 13 runtime on a 12.x driver); an exact `exit:N` or `cuda-error:N` is "
        "predicted only where it is known (the harness's own children, the reference, a case's "
        "`expect:`). A mismatch means the observation contradicts what was known.",
        "",
        "The full grammar of a word, as the loader checks it:",
        "",
        "```text",
        model.OUTCOME_RE.pattern,
        "```",
    ]
    rules = _judge_rules()
    if rules:
        lines += ["", "## How a cell's status is decided", "", _rst_to_md(rules)]
    doc = _rst_to_md(errors.__doc__ or "")
    codes = doc.split("Exit codes of every `cumatrix` command:", 1)
    lines += ["", "## Exit codes", ""]
    if len(codes) == 2:
        lines += [codes[1].strip(), ""]
    lines += [
        "An interrupted run (Ctrl-C, SIGTERM) ends with its finished cells kept and exit 130.",
        "",
        "Each error cumatrix raises on purpose carries its exit code:",
        "",
        "| error | exit code | when |",
        "|---|---|---|",
    ]
    lines += [f"| `{n}` | {c} | {_cell(_rst_to_md(d))} |" for n, c, d in _error_classes(errors)]
    return "\n".join(lines) + "\n"


BUILDERS = {"reference/matrix.md": matrix_reference, "reference/cli.md": cli_reference,
            "reference/outcomes.md": outcomes_reference}


# --------------------------------------------------------------------------- links out of docs/

_LINK_RE = re.compile(r"(!?\[[^\]\n]*\]\()([^)\s]+)(\))")
_FENCE_RE = re.compile(r"^(```|~~~)", re.MULTILINE)


def _outside_code(markdown: str) -> Iterator[tuple[bool, str]]:
    """(is prose, text) pieces of ``markdown``: links inside fenced code are left alone."""
    inside = False
    for chunk in re.split(r"(^(?:```|~~~)[^\n]*\n)", markdown, flags=re.MULTILINE):
        if _FENCE_RE.match(chunk):
            yield False, chunk
            inside = not inside
        else:
            yield not inside, chunk


def repo_target(page_uri: str, url: str) -> str | None:
    """The repository path (relative to its root) of a link that leaves docs/, else None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.IGNORECASE) or url.startswith(("#", "/")):
        return None
    path = url.split("#", 1)[0].split("?", 1)[0]
    target = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_uri), path))
    if target == "docs" or target.startswith("docs/") or target.startswith(".."):
        return None
    return target


def links_out(markdown: str, page_uri: str) -> list[str]:
    """Repository paths a page links to outside docs/."""
    out = []
    for prose, text in _outside_code(markdown):
        if prose:
            out += [t for m in _LINK_RE.finditer(text) if (t := repo_target(page_uri, m.group(2)))]
    return out


def _site_uri(target: str) -> str:
    """Where repository file (or directory listing) ``target`` lives in the site."""
    if (ROOT / target).is_dir():
        return f"{REPO_PREFIX}/{target}/index.md"
    return f"{REPO_PREFIX}/{target}"


def rewrite_links(markdown: str, page_uri: str) -> str:
    """``markdown`` with links that leave docs/ pointing at the copies under ``repo/``."""

    def fix(m: re.Match[str]) -> str:
        url = m.group(2)
        target = repo_target(page_uri, url)
        if target is None:
            return m.group(0)
        anchor = "#" + url.split("#", 1)[1] if "#" in url else ""
        rel = posixpath.relpath(_site_uri(target), posixpath.dirname(page_uri) or ".")
        return f"{m.group(1)}{rel}{anchor}{m.group(3)}"

    return "".join(_LINK_RE.sub(fix, text) if prose else text for prose, text in _outside_code(markdown))


def _listing(target: str) -> str:
    d = ROOT / target
    entries = sorted(p.name for p in d.iterdir() if p.is_file())
    lines = [f"# {target}/", "", "Files of this directory of the repository:", ""]
    lines += [f"- [{name}]({name})" for name in entries]
    subdirs = sorted(p.name for p in d.iterdir() if p.is_dir())
    if subdirs:
        lines += ["", "Directories: " + ", ".join(f"[{n}/]({n}/index.md)" for n in subdirs) + "."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- MkDocs events


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages and the repository files the pages link to."""
    from mkdocs.structure.files import File, InclusionLevel

    class RepoFile(File):
        """A repository file copied into the site as it is (a Markdown report is not rendered)."""

        def is_documentation_page(self) -> bool:
            return False

    for uri, build in BUILDERS.items():
        files.append(File.generated(config, uri, content=build()))
    wanted: set[str] = set()
    for page in list(files.documentation_pages()):
        wanted.update(links_out(page.content_string, page.src_uri))
    done: set[str] = set()

    def publish(target: str) -> None:
        if target in done:
            return
        done.add(target)
        path = ROOT / target
        if path.is_dir():
            files.append(File.generated(config, f"{REPO_PREFIX}/{target}/index.md", content=_listing(target),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
            for child in path.iterdir():
                publish(f"{target}/{child.name}")
        elif path.is_file():
            f = RepoFile(f"{REPO_PREFIX}/{target}", src_dir=None, dest_dir=config.site_dir,
                         use_directory_urls=config.use_directory_urls)
            f.abs_src_path = str(path)
            files.append(f)
        else:
            log.warning("a page links to %s, which is not in the repository", target)

    for target in sorted(wanted):
        publish(target)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point links that leave docs/ at the copies ``on_files`` published."""
    if page.file.src_uri.startswith(f"{REPO_PREFIX}/"):
        return markdown  # a generated listing: its links are already relative to the copies
    return rewrite_links(markdown, page.file.src_uri)
