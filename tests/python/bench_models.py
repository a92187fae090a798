"""bench/models.py, importable from the tests (conftest.load_bench loads it once)."""
from conftest import load_bench


def module():
    return load_bench("models")


def build(*args, **kwargs):
    return module().build(*args, **kwargs)
