"""The README's example runs as written, from outside the repository, and keeps every FFN sparse."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_example_runs_sparse(tmp_path):
    use = (ROOT / "README.md").read_text().split("\n## Use\n", 1)[1]  # the example of the "Use" section
    code = re.search(r"```python\n(.*?)```", use, re.S).group(1)
    assert not re.search(r"^\s*(from|import) bench\b", code, re.M)  # bench is not installed
    # from an empty folder: only what `pip install` put on the path can be imported
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 sparse FFN site(s), 0 dense" in done.stdout
    assert "not a multiple" not in done.stdout + done.stderr
