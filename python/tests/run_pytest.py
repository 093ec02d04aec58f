#!/usr/bin/env python3
"""ctest's entry to the Python tests: exit 77 (skipped) without pytest or torch, else pytest's status."""
import sys

try:
    import pytest
    import torch  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e} (bash scripts/setup installs pytest and torch)")
    sys.exit(77)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
