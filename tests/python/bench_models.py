"""bench/models.py, importable from the tests."""
import importlib.util
import os

_path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "models.py")
_mod = None


def module():
    global _mod
    if _mod is None:
        spec = importlib.util.spec_from_file_location("comfuse_bench_models", _path)
        _mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_mod)
    return _mod


def build(*args, **kwargs):
    return module().build(*args, **kwargs)
