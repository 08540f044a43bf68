"""A llama.cpp build whose libraries export a statically linked C++ runtime is refused before it can crash.

On the lent H100 the device image's compiler linked libstdc++ into every library and exported it; libllama
then wrote a number to a stream with libggml-cuda's copy of the code and its own copy's locale, and the
model load segfaulted. The check reads each library's symbol table; the controls are real shared libraries
compiled here: one built that way (detected), the same with ``-Wl,--exclude-libs,ALL`` (the fix `make
install` applies) and one linked to libstdc++.so as usual (both accepted).
"""

import shutil
import subprocess

import pytest

from localspec.core.errors import ModelError
from localspec.llama import runtime

SOURCE = '#include <sstream>\nextern "C" int digits(long x) { std::ostringstream s; s << x; return s.str().size(); }\n'
BUILDS = {
    "exported": ["-static-libstdc++"],
    "private": ["-static-libstdc++", "-Wl,--exclude-libs,ALL"],
    "shared": [],
}


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """The three builds of one small C++ library, each in a folder of its own as ``libggml-cuda.so``."""
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed (make install builds llama.cpp with it)"
    root = tmp_path_factory.mktemp("cxx")
    (root / "digits.cpp").write_text(SOURCE)
    built = {}
    for name, flags in BUILDS.items():
        folder = root / name
        folder.mkdir()
        library = folder / "libggml-cuda.so"
        subprocess.run([compiler, "-shared", "-fPIC", *flags, str(root / "digits.cpp"), "-o", str(library)], check=True)
        built[name] = library
    return built


def test_a_library_that_exports_its_cxx_runtime_is_detected(libraries):
    assert runtime.exports_cxx_runtime(libraries["exported"])
    assert not runtime.exports_cxx_runtime(libraries["private"])
    assert not runtime.exports_cxx_runtime(libraries["shared"])


def test_such_a_build_is_refused_with_the_fix(libraries):
    with pytest.raises(ModelError, match=r"libggml-cuda\.so export a C\+\+ runtime.*make install"):
        runtime.check_cxx_runtime(libraries["exported"].parent)
    runtime.check_cxx_runtime(libraries["private"].parent)
    runtime.check_cxx_runtime(libraries["shared"].parent)


def test_a_file_that_is_not_elf_exports_nothing(tmp_path):
    library = tmp_path / "libllama.dylib"
    library.write_bytes(b"\xcf\xfa\xed\xfe" + bytes(64))  # a Mach-O header
    assert not runtime.exports_cxx_runtime(library)


def test_the_installed_build_passes_and_each_library_is_read_once():
    libraries = runtime.library_files()
    assert {"llama", "ggml-base", "ggml-cpu"} <= set(libraries)
    assert all(path.name.endswith(".so") for path in libraries.values())  # the shortest of each library's names
    assert not [path for path in libraries.values() if runtime.exports_cxx_runtime(path)]


PATCH_SOURCE = 'extern "C" int localspec_patch_cuda_batch_invariant(void) { return 1; }\n'


@pytest.mark.parametrize(("flags", "announced"), [([], True), (["-fvisibility=hidden"], False)])
def test_the_cuda_patch_is_found_in_the_gpu_library_symbol_table(tmp_path, monkeypatch, flags, announced):
    """libggml-cuda is too large to read whole: the CUDA patch's symbol is looked up in its hash table. A
    library that keeps the symbol hidden is the control (a build that does not announce the patch)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    (tmp_path / "patch.cpp").write_text(PATCH_SOURCE)
    library = tmp_path / "libggml-cuda.so"
    subprocess.run([compiler, "-shared", "-fPIC", *flags, str(tmp_path / "patch.cpp"), "-o", str(library)], check=True)
    assert runtime.defines_symbol(library, "localspec_patch_cuda_batch_invariant") is announced
    monkeypatch.setattr(runtime, "library_files", lambda folder=None: {"ggml-cuda": library})
    runtime.build_patches.cache_clear()
    try:
        assert (runtime.CUDA_PATCH in runtime.build_patches()) is announced
        assert runtime.cuda_batch_invariant() is announced
        for value in ("1", ""):  # the patch's kernel choice undone: set at all, as the patch's getenv reads it
            monkeypatch.setenv(runtime.CUDA_STOCK_DISPATCH_ENV, value)
            assert not runtime.cuda_batch_invariant(), value
    finally:
        runtime.build_patches.cache_clear()
