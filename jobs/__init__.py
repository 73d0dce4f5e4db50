"""pooljobs' notebook API: `jobs.embed`, `jobs.classify`, `jobs.score`, `jobs.shutdown`
(see `jobs.api`).

The functions load on first use, so `python -m jobs.embed --help` imports none of the
API's dependencies. `jobs.embed` and `jobs.score` are also the CLI modules' names
(`python -m jobs.embed`). Importing a submodule sets it as an attribute of its package,
which would hide the function; the package's class below keeps those names for the
functions, while the modules stay importable through `sys.modules`.
"""

import sys
import types

__all__ = ["JobFailedError", "classify", "embed", "score", "shutdown"]


def __getattr__(name: str):
    if name in __all__:
        from jobs import api

        return getattr(api, name)
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        if name in ("embed", "score") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
