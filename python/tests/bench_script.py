"""Loads one of the repository's bench/ scripts as a module for its tests (they are scripts, not a
package): load_bench("ab/ab_model_summary") is bench/ab/ab_model_summary.py."""
import importlib.util
import os

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def load_bench(name):
    spec = importlib.util.spec_from_file_location(os.path.basename(name), os.path.join(BENCH, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
