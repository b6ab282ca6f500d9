"""The corpus: Python source files already on the machine, as bytes (vocabulary 256). No downloads.

Three corpora (``Corpus.load(source=...)``):
- "stdlib" (the main job's default, ~10 MB on the GPU machines): files under
  ``sysconfig.get_paths()['stdlib']`` (site-packages excluded) sorted by path, every 10th to validation.
- "packages" (~100 MB, enough for one epoch of the 125M job): the standard library plus the installed
  ``torch`` and ``sympy`` packages (both dependencies of this project), in a deterministic order
  (source, then relative path), deduplicated by content (a file whose bytes were seen already is
  skipped); validation = whole files whose "source/relative path" hashes to 0 mod 10.
- "site" (a few hundred MB where transformers is installed): the standard library plus every top-level
  folder of site-packages (``sysconfig.get_paths()['purelib']``), built as "packages" is: for runs long
  enough to repeat "packages" (it holds about 4300 steps of 16 x 1024 tokens), whose loss would flatten
  from repetition rather than from learning.
Each split is the concatenation of its files' bytes, cached as a uint8 array that is memory-mapped
on later runs; the cache key covers the file list, sizes and versions.
"""

import hashlib
import os
import sys
import sysconfig
from collections.abc import Sequence
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


CORPORA = ("stdlib", "packages", "site")
SKIP_DIRS = ("__pycache__",)  # site-packages folders that hold no package of their own
SKIP_SUFFIXES = (".dist-info", ".egg-info", ".data")


def package_roots() -> list[tuple[str, Path]]:
    """(label, root) of the "packages" corpus: the standard library, torch, sympy."""
    import sympy

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [("stdlib", stdlib), ("torch", Path(torch.__file__).parent), ("sympy", Path(sympy.__file__).parent)]


def site_roots(purelib: Path | None = None) -> list[tuple[str, Path]]:
    """(label, root) of the "site" corpus: the standard library, then every folder directly under
    ``purelib`` (default: this interpreter's site-packages) by name, less caches and install metadata."""
    site = Path(purelib or sysconfig.get_paths()["purelib"])
    folders = sorted(
        p for p in site.iterdir() if p.is_dir() and p.name not in SKIP_DIRS and not p.name.endswith(SKIP_SUFFIXES)
    )
    return [("stdlib", Path(sysconfig.get_paths()["stdlib"]))] + [(p.name, p) for p in folders]


def package_files(roots: Sequence[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """("label/relative/path.py", path) of every .py file under the roots (site-packages excluded),
    sorted by root order, then relative path."""
    out = []
    for label, root in roots:
        rels = sorted(p.relative_to(root) for p in Path(root).rglob("*.py") if p.is_file())
        out += [(f"{label}/{rel.as_posix()}", Path(root) / rel) for rel in rels if "site-packages" not in rel.parts]
    if not out:
        raise FileNotFoundError(f"no .py files under {[str(r) for _, r in roots]}: cannot build the corpus")
    return out


def is_val(name: str) -> bool:
    """Whether the file called ``name`` ("label/relative/path") is held out for validation."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % VAL_EVERY == 0


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
    def load(
        cls,
        cache_dir: Path | None = None,
        root: Path | None = None,
        source: str = "stdlib",
        roots: Sequence[tuple[str, Path]] | None = None,
    ) -> "Corpus":
        """The ``source`` corpus ("stdlib" under ``root``, or "packages" / "site" under ``roots``;
        default the installed ones), built into ``cache_dir`` the first time."""
        if source not in CORPORA:
            raise ValueError(f"corpus source={source!r}: expected one of {CORPORA}")
        if source == "packages":
            return cls._load_packages(Path(cache_dir or default_cache_dir()), roots or package_roots())
        if source == "site":
            return cls._load_packages(Path(cache_dir or default_cache_dir()), roots or site_roots(), "site")
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

    @classmethod
    def _load_packages(cls, cache: Path, roots: Sequence[tuple[str, Path]], name: str = "packages") -> "Corpus":
        from tqdm import tqdm

        files = package_files(roots)
        labels = [label for label, _ in roots]
        # "site" names its folders, not their versions: importing every installed package to ask is slow and
        # can fail; its listing of names and sizes keys the cache all the same
        versions = (
            _versions(labels)
            if name == "packages"
            else _versions(labels[:1]) + f" + {len(labels) - 1} site-packages folders"
        )
        listing = "\n".join(f"{name}:{p.stat().st_size}" for name, p in files) + versions
        key = hashlib.sha256(listing.encode()).hexdigest()[:16]
        paths = {split: cache / f"{name}-{key}-{split}.u8" for split in ("train", "val", "count")}
        if not all(p.exists() for p in paths.values()):
            cache.mkdir(parents=True, exist_ok=True)
            parts: dict[str, list[bytes]] = {"train": [], "val": []}
            seen: set[bytes] = set()
            for name, path in tqdm(files, desc="building the corpus", unit="file", file=sys.stderr):
                data = path.read_bytes()
                digest = hashlib.sha256(data).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                parts["val" if is_val(name) else "train"].append(data)
            payload = {"train": b"".join(parts["train"]), "val": b"".join(parts["val"])}
            payload["count"] = str(len(seen)).encode()
            for split, data in payload.items():
                tmp = paths[split].with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(data)
                tmp.replace(paths[split])
        n_files = int(paths["count"].read_bytes())
        arrays = {split: np.memmap(paths[split], dtype=np.uint8, mode="r") for split in ("train", "val")}
        source = f"{versions} sources ({len(files)} files, {n_files} after removing duplicates)"
        return cls(arrays["train"], arrays["val"], source, n_files)


def _versions(labels: Sequence[str]) -> str:
    """'Python 3.11.7 stdlib + torch 2.13.0+cpu + sympy 1.14.0' for the roots' labels."""
    out = []
    for label in labels:
        if label == "stdlib":
            out.append(f"Python {sys.version.split()[0]} stdlib")
        else:
            try:
                out.append(f"{label} {__import__(label).__version__}")
            except (ImportError, AttributeError):
                out.append(label)
    return " + ".join(out)


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
