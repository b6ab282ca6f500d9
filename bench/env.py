"""Where a number came from: device, versions, git revision, command. Printed with every result.
Also the one CSV writer the bench scripts share."""

import csv
import os
import shlex
import subprocess
import sys
from pathlib import Path

import torch


def git_revision() -> str:
    """Short HEAD (+"-dirty"), or $SPARSE_COMPILE_GIT_REV for a copied source tree without .git."""
    if os.environ.get("SPARSE_COMPILE_GIT_REV"):
        return os.environ["SPARSE_COMPILE_GIT_REV"]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(device: torch.device, program: str, argv: list[str] | None = None) -> dict[str, str]:
    """Device, versions, git revision, the gather kernels' tuning choices already on disk
    (kernels/tune_cache.py) and the command line (``program`` + argv, default sys.argv[1:])."""
    try:
        import triton

        from sparse_compile.kernels.tune_cache import stored_choices

        triton_version, tuned = triton.__version__, stored_choices()
    except ImportError:
        triton_version, tuned = "none", "none"
    cusparselt = "none"
    if device.type == "cuda":
        try:
            cusparselt = str(torch.backends.cusparselt.version())
        except (AttributeError, RuntimeError):
            cusparselt = "unavailable"
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cusparselt": cusparselt,
        "git": git_revision(),
        "tuned kernels": tuned,
        "command": " ".join([program, *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))]),
    }


def write_csv(path: str | Path, rows: list[dict], fieldnames: list[str] | None = None) -> None:
    """``rows`` as CSV with a header (``fieldnames``, default every row's keys in first-seen order;
    missing cells empty)."""
    fieldnames = fieldnames or list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
