import copy
import json
import os

import pytest
import torch
from samples import VALID


def _a_share_of_the_cores() -> None:
    """Under pytest-xdist (`-n N`) each test process gets its share of the cores for torch's intra-op threads, and
    the reference workers it starts inherit it (OMP_NUM_THREADS passes the sandbox: confine.ENV_ALLOW): torch's
    default, every core in every process, oversubscribes them, and on the 2-core CI machine threads waiting at
    each other's barriers doubled the suite's time (test_errormodel.py: 536 s on `-n 2`, 258 s with one thread
    each). The reference sessions do the same (sweep/session.child_environment); an OMP_NUM_THREADS already set
    stands."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_a_share_of_the_cores()


@pytest.fixture
def valid():
    """A fresh copy of a valid definition dict."""
    return copy.deepcopy(VALID)


@pytest.fixture
def write_def(tmp_path):
    """Write a definition dict (or raw text) to tmp_path/<stem>.json and return the path."""

    def write(data, stem=None):
        stem = stem or (data.get("name") if isinstance(data, dict) else None) or "definition"
        path = tmp_path / f"{stem}.json"
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
        return path

    return write
