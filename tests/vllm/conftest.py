"""Fixtures of the vLLM connector tests: real orbitkv-cache-manager processes.

Run in the pinned vLLM environment (scripts/vllm_env.sh) with the orbitkv
module built for its interpreter on PYTHONPATH and $ORBITKV_MANAGER_BINARY
naming the Manager (scripts/test.sh sets all three). Without vLLM or orbitkv
every test here is skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # kvreplay, harness

try:
    import orbitkv  # noqa: F401
    import vllm  # noqa: F401
except ImportError as e:  # pragma: no cover - environment without vLLM
    pytest.skip(f"vLLM connector tests need vllm and orbitkv: {e}", allow_module_level=True)

# The Manager process class and factory of tests/python/conftest.py, loaded
# from there, not copied (tests/sglang does the same).
_spec = importlib.util.spec_from_file_location(
    "orbitkv_python_conftest", HERE.parent / "python" / "conftest.py")
_python_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_python_conftest)
ManagerProc = _python_conftest.Manager
manager_binary = _python_conftest.manager_binary


@pytest.fixture
def start_manager(manager_binary):
    """start_manager(pool_size="64mib", ssd=False) -> ManagerProc: the connector
    tests run on a DRAM-only Manager unless a test asks for SSD."""
    with _python_conftest.managers(manager_binary, ssd_default=False) as start:
        yield start


@pytest.fixture
def manager(start_manager) -> ManagerProc:
    return start_manager()


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    import harness

    return harness.model_dir(tmp_path_factory.mktemp("model"))
