"""pooljobs' notebook API: `jobs.embed`, `jobs.classify`, `jobs.score` (see `jobs.api`).

`jobs.embed` and `jobs.score` are also the CLI modules' names (`python -m jobs.embed`).
Importing a submodule sets it as an attribute of its package, which would replace the
function; the package's class below keeps the functions, while the modules stay
importable through `sys.modules` (`python -m jobs.embed`, `from jobs.embed import ...`).
"""

import sys
import types

from jobs.api import JobFailedError, classify, embed, score

__all__ = ["JobFailedError", "classify", "embed", "score"]


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        if name in ("embed", "score") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
