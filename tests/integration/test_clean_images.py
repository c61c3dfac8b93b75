"""``cumatrix clean --images`` against a real Docker daemon.

Two throwaway images labelled as base images (``cumatrix.base``: a tagged one is only ever
removed by ``clean --images``, whereas other test runs on the same daemon sweep the
``cumatrix=1`` runtime images they did not find at their start), built FROM scratch here, one
of them used by a container that never started.  The daemon is shared: the CLI is only run in modes that remove
nothing (a dry run, a refused confirmation, a "no" typed on a terminal); the removal itself is
exercised on this test's own image through the function the CLI calls.
"""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.docker


@pytest.fixture
def client() -> Iterator[Any]:
    try:
        import docker

        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as e:  # noqa: BLE001  any failure (import, socket, API) means no daemon answers
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but no Docker daemon answers: {e}")
        pytest.skip(f"no Docker daemon answers ({e}); set CUMATRIX_REQUIRE_DOCKER=1 to require one")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def images(client: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:10]
    (tmp_path / "f").write_text("x\n")
    made: dict[str, Any] = {}
    try:
        for name in ("free", "used"):
            (tmp_path / "Dockerfile").write_text(f'FROM scratch\nCOPY f /f\nCMD ["/f-{name}"]\nLABEL cumatrix.base=clean-test\n')
            made[name] = _build(client, tmp_path, f"cumatrix-clean-test-{name}:{tag}")
        made["container"] = client.containers.create(made["used"].id, name=f"cumatrix-clean-test-{tag}")
        yield made
    finally:
        if "container" in made:
            made["container"].remove(force=True)
        for name in ("free", "used"):
            if name in made:
                with contextlib.suppress(Exception):  # removed by the test itself
                    client.images.remove(made[name].id, force=True)


def _build(client: Any, context: Path, tag: str) -> Any:
    """Build the image, up to three times: other test runs on the same daemon prune dangling
    base-labelled images, and the labelled step is dangling for a moment before it is tagged."""
    import docker.errors

    for attempt in range(3):
        try:
            return client.images.build(path=str(context), tag=tag, rm=True)[0]
        except (docker.errors.BuildError, docker.errors.ImageNotFound) as e:
            if attempt == 2 or "no such" not in str(e).lower():
                raise
    raise AssertionError("unreachable")


def _names(img: Any) -> str:
    return str(img.tags[0])


def test_images_are_listed_and_kept_without_yes(images: dict[str, Any], client: Any,
                                                cli_env: Callable[..., dict[str, str]], tmp_path: Path) -> None:
    env = cli_env({"CUMATRIX_CACHE": str(tmp_path / "no-cache")})
    free, used = _names(images["free"]), _names(images["used"])
    dry = subprocess.run([sys.executable, "-m", "cumatrix", "clean", "--images", "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert dry.returncode == 0, dry.stderr
    assert f"would remove image {free}" in dry.stdout
    assert f"keeping image {used}: used by container cumatrix-clean-test-" in dry.stdout
    assert f"would remove image {used}" not in dry.stdout
    # No terminal to ask on and no --yes: the list, a message, exit 2, nothing removed.
    refused = subprocess.run([sys.executable, "-m", "cumatrix", "clean", "--images"], env=env,
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"image {free}" in refused.stdout
    assert "--yes" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert client.images.get(images["free"].id)
    assert client.images.get(images["used"].id)


def test_a_no_typed_on_a_terminal_removes_nothing(images: dict[str, Any], client: Any,
                                                  cli_env: Callable[..., dict[str, str]], tmp_path: Path) -> None:
    env = cli_env({"CUMATRIX_CACHE": str(tmp_path / "no-cache")})
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin is the terminal
        os.execve(sys.executable, [sys.executable, "-m", "cumatrix", "clean", "--images"], env)
    out = b""
    try:
        while b"[y/N]" not in out:
            chunk = os.read(fd, 4096)
            assert chunk, out
            out += chunk
        os.write(fd, b"n\n")
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert b"nothing removed" in out
    assert client.images.get(images["free"].id)


def test_removal_takes_the_free_image_and_never_one_a_container_uses(images: dict[str, Any], client: Any) -> None:
    import docker.errors

    from cumatrix.front.clean import clean_images, planned_images

    go, kept = planned_images(client)
    ids = {i.id for i in go}
    assert images["free"].id in ids
    assert images["used"].id not in ids
    assert any(_names(images["used"]) in k for k in kept)
    # Ours alone, and no pruning of build stages: the daemon is shared.
    done = clean_images(client, [i for i in go if i.id == images["free"].id], stages=False)
    assert _names(images["free"]) in done.images
    assert not done.kept
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(images["free"].id)
    assert client.images.get(images["used"].id)
