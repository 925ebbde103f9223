"""The package as a learner installs it: a wheel built from a clean copy of the repository, installed into an
empty folder and imported from outside the repository, with the repository's src/ off the path.

The copy holds the files a commit of the working tree would: those git tracks and those it does not ignore (in a
fresh clone, exactly the tracked ones), never a build folder or an egg-info left behind. The wheel must hold every
one of them that belongs to the package (the built-in models' assets, the book's recorded runs behind the
src/specbook/results link), and the installed copy must load the built-in pair, generate, and read a recorded run.
The build needs no download: it uses the build backend of this environment.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

# Run in the installed copy: load the built-in pair, generate greedily both ways, read a recorded run.
SCRIPT = """
import json, sys
import specbook
from specbook.bench import read_recorded

pair = specbook.load_pair("shakespeare")
input_ids = pair.encode("ROMEO:\\n")
speculative = specbook.speculative_generate(pair.target, pair.draft, input_ids, 8, k=3, sampler=specbook.Sampler(0))
autoregressive = specbook.autoregressive_generate(pair.target, input_ids, 8, specbook.Sampler(0))
json.dump({"file": specbook.__file__, "path": sys.path, "speculative": speculative.token_ids,
           "autoregressive": autoregressive.token_ids, "text": pair.tokenizer.decode(speculative.token_ids),
           "family": read_recorded("family.json")}, sys.stdout)
"""


def _git(*args) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def _checkout_files() -> list[str]:
    """The files a commit of the working tree would hold, or a skip where there is no git checkout."""
    try:
        names = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
        return sorted({name for name in names if name and os.path.lexists(ROOT / name)})
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the wheel is built from the files git tracks or does not ignore")


def _missing_build_backend() -> list[str]:
    """The build-system requirements of pyproject.toml that this environment does not meet."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    missing = []
    for requirement in map(Requirement, requires):
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            missing.append(str(requirement))
    return missing


def _in_repository(entry: str) -> bool:
    """Whether a sys.path entry is the repository's (src/, tests/, ...) rather than its environment's."""
    path = Path(entry).resolve()
    return path.is_relative_to(ROOT) and not path.is_relative_to(Path(sys.prefix).resolve())


def _pip(*args, cwd: Path):
    result = subprocess.run([sys.executable, "-m", "pip", *args, "--no-deps", "--no-index", "--quiet",
                             "--disable-pip-version-check"], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"pip {args[0]} failed:\n{result.stdout}\n{result.stderr}"


def _shipped(name: str) -> str | None:
    """Where a file of the checkout lies in the wheel (None: not part of the package)."""
    if name.startswith("src/specbook/") and name != "src/specbook/results":  # the link: its files below
        return name.removeprefix("src/")
    if name.startswith("results/"):
        return f"specbook/{name}"
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout's files (links kept as links), with no download."""
    missing = _missing_build_backend()
    if missing:
        pytest.skip(f"this environment lacks the build backend {missing}: the wheel is built without a download")
    checkout = tmp_path_factory.mktemp("checkout")
    for name in _checkout_files():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name, follow_symlinks=False)
    dist = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-build-isolation", "--wheel-dir", str(dist), ".", cwd=checkout)
    (built,) = dist.glob("specbook-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {shipped for name in _checkout_files() if (shipped := _shipped(name))}
    assert {"specbook/assets/shakespeare/target/model.safetensors", "specbook/results/family.json"} <= expected
    assert not expected - names, f"files of the package missing from the wheel: {sorted(expected - names)}"


def test_the_installed_wheel_generates_and_reads_a_recorded_run(wheel, tmp_path):
    installed, elsewhere = tmp_path / "installed", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _pip("install", "--target", str(installed), str(wheel), cwd=elsewhere)
    # This environment's dependencies, but nothing from the repository (an editable install puts src/ on the
    # path through a .pth file: -S reads none).
    outside = [entry for entry in sys.path if entry and not _in_repository(entry)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), *outside]), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-S", "-c", SCRIPT], cwd=elsewhere, env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert Path(report["file"]).is_relative_to(installed), report["file"]
    assert not [entry for entry in report["path"] if entry and _in_repository(entry)], report["path"]
    assert len(report["speculative"]) == 8 and report["speculative"] == report["autoregressive"]
    assert report["text"].strip()
    assert report["family"] == json.loads((ROOT / "results" / "family.json").read_text())
