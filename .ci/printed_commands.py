"""Every command the fuzzer prints runs as printed, for a user who installed the project.

Run from outside the repository (tox's `coexist` environment installs the wheel and runs this in a
scratch folder), so only installed names resolve: the usage lines name ``python -m specsample.fuzz``,
the replay line a campaign prints and the reproducer's ``replay`` field replay the failure (exit 1),
and the pytest plugin's replay line selects the failed test again.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

FUZZ = ["python", "-m", "specsample.fuzz"]


def run(command: str | list[str], expect: int) -> str:
    """Run ``command`` (a line as printed, through the shell, or an argument list); check its exit code."""
    shell = isinstance(command, str)
    done = subprocess.run(command, shell=shell, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{command!r} exited {done.returncode}, not {expect}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    print(f"ok ({done.returncode}): {command if shell else ' '.join(command)}")
    return done.stdout


# Every usage line names the module the user ran.
for sub in ("run", "replay", "list", "mutants", "certify"):
    usage = run([*FUZZ, sub, "--help"], 0)
    assert usage.startswith(f"usage: python -m specsample.fuzz {sub}"), usage[:200]

# A failing campaign prints a replay line; run as printed, it replays the failure.
out = run([*FUZZ, "run", "--variant", "M04", "--budget", "30", "--corpus", "corpus", "--device", "cpu"], 1)
printed = re.search(r"^Replay: +(.+)$", out, re.MULTILINE)
assert printed is not None, out
assert printed.group(1).startswith("python -m specsample.fuzz replay "), printed.group(1)
run(printed.group(1), 1)
(reproducer,) = Path("corpus").glob("*.json")
run(json.loads(reproducer.read_text())["replay"], 1)

# The pytest plugin's replay line selects the failed test again.
plugin = [
    "pytest",
    "--specsample-variant",
    "M03",
    "--specsample-profile",
    "ci",
    "-x",
    "-q",
    "-p",
    "no:cacheprovider",
]
failed = run(plugin, 1)
replay = r"replay: (\S+ -m pytest --specsample-variant M03 --specsample-profile ci -k '[^']+')"
line = re.search(replay, failed)
assert line is not None, failed[-3000:]
again = run(f"{line.group(1)} -q -p no:cacheprovider", 1)
assert re.search(r"\b1 failed\b", again) and "passed" not in again, again[-2000:]
print(f"OK: every printed command ran as printed ({sys.executable})")
