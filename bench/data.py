"""The corpus: Python source files already on the machine, as bytes (vocabulary 256). No downloads.

Three corpora (``Corpus.load(source=...)``):
- "stdlib" (the main job's default, ~10 MB on the GPU machines): files under
  ``sysconfig.get_paths()['stdlib']`` (site-packages excluded) sorted by path, every 10th to validation.
- "packages" (~100 MB, enough for one epoch of the 125M job): the standard library plus the installed
  ``torch`` and ``sympy`` packages (both dependencies of this project), in a deterministic order
  (source, then relative path), deduplicated by content (a file whose bytes were seen already is
  skipped); validation = whole files whose "source/relative path" hashes to 0 mod 10.
- "site" (several times "packages" where more is installed): the standard library plus every folder
  directly under site-packages (``purelib`` and ``platlib``; not links, caches or install metadata),
  less vendored copies (``_vendor``, ``vendor``, ``vendored`` folders) and files over MAX_SITE_FILE
  bytes (generated literals), built as "packages" is; unreadable files are skipped and counted. For
  runs long enough to repeat "packages", whose loss would flatten from repetition, not from learning.
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
VENDORED_PARTS = {"_vendor", "vendor", "vendored"}  # near-copies of other packages: a val file's twin in train
MAX_SITE_FILE = 1 << 20  # bytes: larger .py files are generated data, not code


def package_roots() -> list[tuple[str, Path]]:
    """(label, root) of the "packages" corpus: the standard library, torch, sympy."""
    import sympy

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [("stdlib", stdlib), ("torch", Path(torch.__file__).parent), ("sympy", Path(sympy.__file__).parent)]


def site_dirs() -> list[Path]:
    """This interpreter's site-packages folders: purelib, and platlib where it differs."""
    paths = sysconfig.get_paths()
    dirs = [Path(paths["purelib"])]
    if Path(paths["platlib"]).resolve() != dirs[0].resolve():
        dirs.append(Path(paths["platlib"]))
    return [d for d in dirs if d.is_dir()]


def site_roots(dirs: Sequence[Path] | None = None) -> list[tuple[str, Path]]:
    """(label, root) of the "site" corpus: the standard library, then every folder directly under the
    site-packages ``dirs`` (default: site_dirs()), by name, the first of a name kept: not links (they
    can lead back into site-packages or out of it), caches or install metadata."""
    folders: dict[str, Path] = {}
    for site in dirs if dirs is not None else site_dirs():
        for p in Path(site).iterdir():
            keep = p.is_dir() and not p.is_symlink() and p.name not in SKIP_DIRS
            if keep and not p.name.endswith(SKIP_SUFFIXES):
                folders.setdefault(p.name, p)
    return [("stdlib", Path(sysconfig.get_paths()["stdlib"]))] + [(n, folders[n]) for n in sorted(folders)]


def site_files(roots: Sequence[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """package_files(roots) less vendored copies and files over MAX_SITE_FILE bytes."""
    files = package_files(roots)
    return [
        (name, path)
        for name, path in files
        if not VENDORED_PARTS.intersection(name.split("/")[1:-1]) and path.stat().st_size <= MAX_SITE_FILE
    ]


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
            roots = roots or package_roots()
            files, about = package_files(roots), _versions([label for label, _ in roots])
            return cls._load_files(Path(cache_dir or default_cache_dir()), "packages", files, about, about)
        if source == "site":
            roots = roots or site_roots()
            files = site_files(roots)
            folders = len({name.split("/")[0] for name, _ in files} - {"stdlib"})
            about = f"Python {sys.version.split()[0]} stdlib + site-packages ({folders} folders)"
            # the installed distributions' names carry their versions: an upgrade that keeps every file's
            # size still changes the key (the folders' versions are not asked: importing each is slow, can fail)
            sites = {r.parent for _, r in roots[1:]}  # each site-packages folder listed once
            installed = sorted({p.name for site in sites for p in site.iterdir() if p.name.endswith(".dist-info")})
            return cls._load_files(
                Path(cache_dir or default_cache_dir()), "site", files, about, about + "".join(installed)
            )
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
    def _load_files(
        cls, cache: Path, prefix: str, files: Sequence[tuple[str, Path]], about: str, key_extra: str
    ) -> "Corpus":
        """Build (once) and load a corpus of ``files`` ("label/relative/path", path): deduplicated by
        content, validation by file name (is_val), cached under ``prefix`` and a key of the file list,
        sizes and ``key_extra``; ``about`` names the sources. An unreadable file is skipped and counted."""
        from tqdm import tqdm

        listing = "\n".join(f"{name}:{p.stat().st_size}" for name, p in files) + key_extra
        key = hashlib.sha256(listing.encode()).hexdigest()[:16]
        paths = {split: cache / f"{prefix}-{key}-{split}.u8" for split in ("train", "val", "count")}
        if not all(p.exists() for p in paths.values()):
            cache.mkdir(parents=True, exist_ok=True)
            parts: dict[str, list[bytes]] = {"train": [], "val": []}
            seen: set[bytes] = set()
            unreadable = 0
            for file_name, path in tqdm(files, desc="building the corpus", unit="file", file=sys.stderr):
                try:
                    data = path.read_bytes()
                except OSError:
                    unreadable += 1
                    continue
                digest = hashlib.sha256(data).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                parts["val" if is_val(file_name) else "train"].append(data)
            payload = {"train": b"".join(parts["train"]), "val": b"".join(parts["val"])}
            payload["count"] = f"{len(seen)},{unreadable}".encode()
            for split, data in payload.items():
                tmp = paths[split].with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(data)
                tmp.replace(paths[split])
        n_files, _, unreadable = paths["count"].read_text().partition(",")  # "N" in caches built before the count
        arrays = {split: np.memmap(paths[split], dtype=np.uint8, mode="r") for split in ("train", "val")}
        skipped = f", {unreadable} unreadable skipped" if unreadable not in ("", "0") else ""
        source = f"{about} sources ({len(files)} files, {n_files} after removing duplicates{skipped})"
        return cls(arrays["train"], arrays["val"], source, int(n_files))


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
