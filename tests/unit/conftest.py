import copy
import json

import pytest
from samples import VALID


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
