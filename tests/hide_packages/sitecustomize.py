"""Makes the packages named in $TTS_APPLIANCE_HIDE (comma-separated, e.g. `triton,onnxruntime`, or a module
such as `engines.runtime.sampler`) look uninstalled.

Put this folder first on PYTHONPATH of a child process: every import finder is wrapped so that it finds
nothing for those names. `import triton` then raises ModuleNotFoundError and `importlib.util.find_spec`
returns None, as on a machine without the package; processes the child starts (the engine process)
inherit the variables and hide the same packages.
"""
import os
import sys

_HIDDEN = frozenset(n.strip() for n in os.environ.get("TTS_APPLIANCE_HIDE", "").split(",") if n.strip())


def _hidden(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in _HIDDEN)


class _Hiding:
    """One import finder with the hidden packages removed from what it can find."""

    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if _hidden(name):
            return None
        find = getattr(self._finder, "find_spec", None)
        return find(name, path, target) if find else None

    def invalidate_caches(self):
        if hasattr(self._finder, "invalidate_caches"):
            self._finder.invalidate_caches()

    def __getattr__(self, attr):
        return getattr(self._finder, attr)


if _HIDDEN:
    for _name in [m for m in sys.modules if _hidden(m)]:
        del sys.modules[_name]
    sys.meta_path[:] = [_Hiding(f) for f in sys.meta_path]
