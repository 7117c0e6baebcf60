"""Tests that need an optional tool (clang for fuzzing, QEMU for the Soft-RoCE
guest): on a machine without it they skip, naming what is missing and how to
install it, so a fresh machine passes the README's test command. CI sets
RCOLL_REQUIRE_<TOOL>=1 (.ci/run), and there a missing tool fails the test:
nothing CI is meant to run is skipped silently."""
import os

import pytest


def missing(tool: str, reason: str) -> None:
    """Skips the calling test, or fails it when RCOLL_REQUIRE_<TOOL>=1."""
    variable = f"RCOLL_REQUIRE_{tool.upper()}"
    if os.environ.get(variable) == "1":
        pytest.fail(f"{variable}=1 but {reason}", pytrace=False)
    pytest.skip(f"{reason} (set {variable}=1 to make this a failure)")
