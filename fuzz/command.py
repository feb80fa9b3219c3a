"""The command a user ran, so that every command the fuzzer prints runs as printed.

An installed user runs ``python -m specsample.fuzz``; from the repository root ``python -m fuzz`` is
the same program. Usage lines, replay lines, the reproducer's ``replay`` field and the workers'
command lines all name the module and the interpreter the user ran.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

# The module printed when the program was not started with ``python -m`` (a test calling `cli.main`).
INSTALLED_MODULE = "specsample.fuzz"


def module() -> str:
    """The package the user ran with ``-m``: ``specsample.fuzz`` or ``fuzz``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", "") or ""
    if name.endswith(".__main__") and name.removesuffix(".__main__").split(".")[-1] == "fuzz":
        return name.removesuffix(".__main__")
    return INSTALLED_MODULE


def python() -> str:
    """The interpreter as the user can type it: its bare name when that name on ``PATH`` is this very
    interpreter (an activated virtual environment), its full path otherwise."""
    executable = Path(sys.executable)
    found = shutil.which(executable.name)
    return executable.name if found and Path(found).absolute() == executable.absolute() else str(executable)


def program() -> str:
    """``python -m specsample.fuzz`` as the user ran it (the interpreter, then the module)."""
    return f"{shlex.quote(python())} -m {module()}"


def argv() -> list[str]:
    """`program` as an argument list, for a subprocess."""
    return [sys.executable, "-m", module()]


def replay(path: Path) -> str:
    """The command that replays the reproducer at ``path``."""
    return f"{program()} replay {shlex.quote(str(path))}"
