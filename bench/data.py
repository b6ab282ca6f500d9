"""The corpus: the Python standard library's own source files, as bytes (vocabulary 256). No downloads.

Files under ``sysconfig.get_paths()['stdlib']`` (site-packages excluded) are sorted by path;
every 10th file goes to validation, the rest to training; each split is the concatenation of
its files' bytes, cached as a uint8 array that is memory-mapped on later runs.
"""

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

VAL_EVERY = 10


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())
    if not files:
        raise FileNotFoundError(f"no .py files under {root}: cannot build the corpus")
    return files


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sparse_compile"


@dataclass
class Corpus:
    """Train and validation byte arrays (np.uint8, memory-mapped) and where they came from."""

    train: np.ndarray
    val: np.ndarray
    source: str
    n_files: int

    @classmethod
    def load(cls, cache_dir: Path | None = None, root: Path | None = None) -> "Corpus":
        files = stdlib_files(root)
        key = hashlib.sha256("\n".join(f"{p}:{p.stat().st_size}" for p in files).encode()).hexdigest()[:16]
        cache = Path(cache_dir or default_cache_dir())
        paths = {split: cache / f"stdlib-{key}-{split}.u8" for split in ("train", "val")}
        if not all(p.exists() for p in paths.values()):
            cache.mkdir(parents=True, exist_ok=True)
            parts: dict[str, list[bytes]] = {"train": [], "val": []}
            for i, f in enumerate(files):
                parts["val" if i % VAL_EVERY == 0 else "train"].append(f.read_bytes())
            for split, chunks in parts.items():
                tmp = paths[split].with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(b"".join(chunks))
                tmp.replace(paths[split])
        arrays = {split: np.memmap(p, dtype=np.uint8, mode="r") for split, p in paths.items()}
        return cls(arrays["train"], arrays["val"], str(files[0].parent), len(files))


class Batches:
    """Random (x, y) windows of one split; the same seed gives the same sequence of batches.

    With ``world`` > 1 every rank draws the same global batch of ``batch_size * world`` windows and
    keeps rows [rank * batch_size, (rank + 1) * batch_size): N ranks at batch_size b see exactly the
    windows one process sees at batch_size N * b, so their loss curves are comparable.
    """

    def __init__(
        self, data: np.ndarray, batch_size: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> None:
        if len(data) <= seq_len + 1:
            raise ValueError(f"split has {len(data)} bytes, too few for seq_len={seq_len}")
        if not 0 <= rank < world:
            raise ValueError(f"rank={rank} must be in [0, world={world})")
        self.data = data
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.rank, self.world = rank, world
        self.generator = torch.Generator().manual_seed(seed)

    def next(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: int64 [batch_size, seq_len], y = x shifted by one byte (this rank's rows)."""
        n = self.batch_size * self.world
        starts = torch.randint(0, len(self.data) - self.seq_len - 1, (n,), generator=self.generator)
        starts = starts[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        rows = np.stack([self.data[s : s + self.seq_len + 1] for s in starts.tolist()]).astype(np.int64)
        xy = torch.from_numpy(rows)
        return xy[:, :-1].to(device, non_blocking=True), xy[:, 1:].to(device, non_blocking=True)
