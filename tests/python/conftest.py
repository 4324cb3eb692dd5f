"""Shared fixtures of the Python package's tests (run by scripts/test_python.sh)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "strata-tiny-moe"


@pytest.fixture(scope="session")
def model_dir():
    return MODEL


@pytest.fixture(scope="session")
def strata_bin():
    """The `strata` binary the suite compares with (scripts/test_python.sh builds it)."""
    path = os.environ.get("STRATA_BIN")
    if not path or not Path(path).exists():
        pytest.fail(f"STRATA_BIN must name the strata binary (got {path!r}); "
                    "run the suite with scripts/test_python.sh")
    return path


@pytest.fixture(scope="session")
def llm(model_dir):
    import strata

    return strata.LLM(str(model_dir))


@pytest.fixture(scope="session")
def accelerator(strata_bin):
    """Skips (or, with STRATA_GPU_TESTS=1, fails) where no accelerator can be opened."""
    r = subprocess.run([strata_bin, "devices", "--json"], capture_output=True, text=True,
                       check=True, timeout=120)
    found = json.loads(r.stdout)
    if not found["devices"]:
        why = f"no accelerator for device='hybrid': {found['error']}"
        if os.environ.get("STRATA_GPU_TESTS") == "1":
            pytest.fail(f"STRATA_GPU_TESTS=1 but {why}")
        pytest.skip(f"SKIPPED: {why} (STRATA_GPU_TESTS=1 makes this a failure)")
