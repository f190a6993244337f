"""Every ```python block of README.md runs verbatim (issue 16, item 12), each in a fresh interpreter started
outside the source tree, with the test session's private disk cache; and the README's install and test
commands are the ones CI runs."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def test_the_readme_has_python_snippets():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index, tmp_path):
    code = BLOCKS[index]
    env = dict(os.environ)
    env.setdefault("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"README snippet {index + 1} failed:\n{code}\n---\n{done.stderr[-4000:]}"


def test_readme_commands_are_the_ones_ci_runs():
    commands = re.search(r"^```bash\n(.*?)^```", README, flags=re.S | re.M).group(1).splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    install_and_run, install_and_test = (line.split("#")[0].strip() for line in commands[:2])
    assert install_and_run.endswith("pip install -e . && polyc run")
    for step in ("python3 -m venv .venv", ". .venv/bin/activate", "pip install -e '.[test]'",
                 "python -m pytest -q -n 2 --dist worksteal tests"):
        assert step in install_and_test and step in ci, step
