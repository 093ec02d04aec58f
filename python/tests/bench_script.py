"""Loads one of the repository's bench/ or lab/ scripts as a module for its tests (they are scripts,
not a package): load_bench("model/fast_llama") is bench/model/fast_llama.py, load_lab("ab/ab_model_summary")
is lab/ab/ab_model_summary.py."""
import importlib.util
import os

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _load(top, name):
    spec = importlib.util.spec_from_file_location(os.path.basename(name), os.path.join(REPO, top, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_bench(name):
    return _load("bench", name)


def load_lab(name):
    return _load("lab", name)
