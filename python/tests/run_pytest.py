#!/usr/bin/env python3
"""ctest's entry to the Python tests: exit 77 (skipped) without pytest or torch, else pytest's status.
(Guarded by __main__: the DDP test's spawned processes re-import this file as their main module.)"""
import sys


def main() -> int:
    try:
        import pytest
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (bash scripts/setup installs pytest and torch)")
        return 77
    return pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
