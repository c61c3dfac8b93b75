"""The directories a sandboxed cell's view makes above its bind points (``viewops._dirs_above``).

A view holds a point for every path a job names and a mask for every file the harness keeps
that a point shows (each earlier run's ``--out`` files among them), so the look-up runs for
every point of every cell.  It follows the ancestors of a directory, not every point and mask:
these tests hold it to the plain definition, on random views and on a view with many masks.
"""

from __future__ import annotations

import random
from pathlib import Path

from cumatrix.execute import viewops
from cumatrix.execute.viewpaths import _under


def _defined(p: str, points: set[str], masks: set[str], made: set[str]) -> list[str]:
    """The definition: a directory above ``p`` is made unless another point shows it (it is or
    lies under that point) and no mask lies above it; each directory once."""
    out: list[str] = []
    parts = p.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        shown = any(_under(d, q) for q in points if q != p) and not any(_under(d, m) and m != d for m in masks)
        if d not in made and not shown:
            out += ["--perms", "0755", "--dir", d]
            made.add(d)
    return out


def _path(rnd: random.Random) -> str:
    return "/" + "/".join(rnd.choice(("a", "b", "tmp", "x")) for _ in range(rnd.randint(1, 5)))


def test_the_directories_above_each_point_are_those_the_definition_gives() -> None:
    rnd = random.Random(49)
    for _ in range(3000):
        points = {_path(rnd) for _ in range(rnd.randint(0, 8))}
        masks = {_path(rnd) for _ in range(rnd.randint(0, 4))}
        shown = viewops._Shown(points, masks)
        made_fast, made_defined = {"/tmp"}, {"/tmp"}
        for p in [*sorted(points | masks), _path(rnd)]:
            assert viewops._dirs_above(p, shown, made_fast) == _defined(p, points, masks, made_defined), (p, points, masks)


def test_a_view_with_many_masks_makes_the_same_directories() -> None:
    # A project whose earlier runs left many --out directories: every cell masks their files.
    points = {"/srv/proj", "/srv/proj/build/lib", "/opt/tools/bin", "/home/u/.venv"}
    masks = {f"/srv/proj/out{i}/{name}" for i in range(200) for name in ("results.jsonl", "index.html")}
    masks |= {"/home/u/.venv/cache"}
    points_and_masks = sorted(points | masks)
    views = viewops._views({p: p for p in points}, [(m, m) for m in masks], [])
    made: set[str] = {"/tmp"}
    expected: list[str] = []
    for p in points_and_masks:
        expected += _defined(p, points, masks, made)
    dirs = [views[i + 1] for i, op in enumerate(views) if op == "--dir"]
    assert dirs == [expected[i + 1] for i, op in enumerate(expected) if op == "--dir"]


def test_a_view_is_the_same_made_anew_or_from_the_points_a_cell_before_named(tmp_path: Path) -> None:
    """The ops of a view's points and masks are kept per harness process (every cell of a run
    names the same paths); what each cell writes, and what the host holds now (which masks are
    directories), is looked at for each cell: a view made from the kept ops is the one made anew."""
    rnd = random.Random(4949)
    (tmp_path / "a").mkdir()
    for _ in range(400):
        points = {_path(rnd): _path(rnd) for _ in range(rnd.randint(0, 6))}
        masked = {_path(rnd) for _ in range(rnd.randint(0, 3))}
        masks = [(m, str(tmp_path / "a") if rnd.random() < 0.5 else m) for m in sorted(masked)]
        writes = [[f"{_path(rnd)}/w{i}.log" for i in range(rnd.randint(0, 2))] for _ in range(3)]
        fresh = []
        for w in writes:
            viewops._point_views.cache_clear()
            fresh.append(viewops._views(points, masks, w))
        viewops._views(points, masks, [f"{_path(rnd)}/first.log"])  # a cell before, another file written
        kept = [viewops._views(points, masks, w) for w in writes]
        assert kept == fresh, (points, masks, writes)
