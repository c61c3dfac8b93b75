"""One options object: the CLI, pytest and the environment build the same RunOptions."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cumatrix.core.options import (
    DEFAULT_TIMEOUT,
    NOBODY,
    WRITE_LIMIT,
    RunOptions,
    SandboxPolicy,
    sandbox_policy,
)
from cumatrix.front import cli


def _run_args(*argv: str) -> argparse.Namespace:
    return cli.parser("run").parse_args(["run", *argv])


class _Config:
    """What RunOptions.from_pytest reads of a pytest config: ``getoption`` by dest (a
    stand-in for pytest.Config; the real one is used by the plugin's integration tests)."""

    def __init__(self, **values: object) -> None:
        self.values = values

    def getoption(self, name: str, default: object = None, skip: bool = False) -> object:
        return self.values.get(name, default)


def test_defaults_are_written_once_and_shared() -> None:
    opts = RunOptions.from_env({})
    assert opts.timeout == DEFAULT_TIMEOUT
    assert opts.policy == SandboxPolicy(sandbox="off", write_limit=WRITE_LIMIT, uid=NOBODY)
    assert RunOptions.from_cli(_run_args(), {}) == RunOptions.build({"out": "out", "backend": "local"}, {})


def test_the_cli_and_pytest_give_the_same_options() -> None:
    args = _run_args("--backend", "docker", "--timeout", "12", "--wheel-dir", "w", "--host", "h1",
                     "--require-gpu", "-k", "probe", "--sandbox", "--pass-env", "A_*",
                     "--sandbox-write-limit", "8M", "--out", "o", "--resume", "--base-image", "img")
    config = _Config(cumatrix_backend="docker", cumatrix_timeout=12.0, cumatrix_wheel_dir="w",
                     cumatrix_host="h1", cumatrix_require_gpu=True, cumatrix_keyword="probe",
                     cumatrix_sandbox="on", cumatrix_pass_env=["A_*"], cumatrix_sandbox_write_limit=8 << 20,
                     cumatrix_out="o", cumatrix_resume=True, cumatrix_base_image="img")
    from_cli, from_pytest = RunOptions.from_cli(args, {}), RunOptions.from_pytest(config, {})
    assert from_cli == from_pytest
    # The run's --out is hidden from its sandboxed cells (the policy names it).
    assert from_cli.policy == SandboxPolicy(sandbox="on", pass_env=("A_*",), write_limit=8 << 20,
                                            hidden=(str(Path("o").absolute()),))
    assert (from_cli.timeout, from_cli.wheel_dir, from_cli.out) == (12.0, Path("w"), Path("o"))


def test_the_environment_fills_what_no_option_gave() -> None:
    env = {"CUMATRIX_SANDBOX": "auto", "CUMATRIX_SANDBOX_WRITE_LIMIT": "64M", "CUMATRIX_SANDBOX_UID": "1234",
           "CUMATRIX_WHEEL_DIR": "/wheels", "CUMATRIX_REQUIRE_GPU": "1"}
    opts = RunOptions.from_cli(_run_args(), env)
    assert opts.policy == SandboxPolicy(sandbox="auto", write_limit=64 << 20, uid=1234,
                                        hidden=(str(Path("out").absolute()),))
    assert opts.wheel_dir == Path("/wheels")
    assert opts.require_gpu
    # A flag wins over the environment.
    flagged = RunOptions.from_cli(_run_args("--no-sandbox", "--sandbox-write-limit", "4K", "--wheel-dir", "mine"), env)
    assert (flagged.policy.sandbox, flagged.policy.write_limit, flagged.wheel_dir) == ("off", 4096, Path("mine"))


def test_the_gate_defaults_to_auto_and_a_malformed_knob_is_ignored() -> None:
    gate_args = cli.parser("gate").parse_args(["gate", "w.whl"])
    assert RunOptions.from_cli(gate_args, {}).policy.sandbox == "auto"
    bad = {"CUMATRIX_SANDBOX_WRITE_LIMIT": "lots", "CUMATRIX_SANDBOX_UID": "-3"}
    assert sandbox_policy(environ=bad) == SandboxPolicy()


def test_options_are_frozen() -> None:
    opts = RunOptions.from_env({})
    with pytest.raises(AttributeError):
        opts.timeout = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="off, auto or on"):
        SandboxPolicy(sandbox="maybe")


def test_a_run_is_sandboxed_by_default_and_the_matrix_may_say_otherwise() -> None:
    """``cumatrix run`` and ``pytest matrix.yaml``: ``auto`` unless an option, the environment
    or the matrix's ``sandbox:`` says (in that order)."""
    plain = RunOptions.from_pytest(_Config(), {})
    assert plain.policy.sandbox == "auto"
    assert RunOptions.from_cli(_run_args(), {}, sandbox_default="auto").policy.sandbox == "auto"
    assert plain.for_matrix(False).sandbox == "off"
    assert plain.for_matrix("required").sandbox == "on"
    assert plain.for_matrix(None).sandbox == "auto"
    flagged = RunOptions.from_pytest(_Config(cumatrix_sandbox="on"), {})
    assert flagged.for_matrix(False).sandbox == "on"
    from_env = RunOptions.from_pytest(_Config(), {"CUMATRIX_SANDBOX": "off"})
    assert from_env.policy.sandbox == "off"
    assert from_env.for_matrix(True).sandbox == "off"
