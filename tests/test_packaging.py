"""The package as a user installs it: a wheel built with ``python -m build`` from the
package's files alone, installed in a fresh virtual environment with no source tree in
sight, runs the demo, the ``cirron`` command and a zero-code run (its entry points)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cirron import __version__
from cirron.exporters import spool_spans
from support import clean_environment

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def run(*command: str | Path, cwd: Path, timeout: float = 600, **environment: str):
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=clean_environment(**environment),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding the built wheel with its torch extra; returns its bin folder."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"  # what the wheel is built from: the package's own files
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "*.so"))  # fmt: skip
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run(sys.executable, "-m", "build", "--outdir", root / "dist", source, cwd=root)
    (wheel,) = (root / "dist").glob("cirron_otel-*.whl")
    # Built here, with a compiler: the compiled hooks are in it, so the wheel is this
    # platform's (cirron.recording.hot).
    assert wheel.name.startswith(f"cirron_otel-{__version__}-cp3")
    assert wheel.name.endswith("linux_x86_64.whl"), wheel.name
    venv = root / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=root)
    pip = (venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "-c", ROOT / "constraints.txt")  # fmt: skip
    run(*pip, "torch==2.13.0", cwd=root)  # the pinned CPU build, as the README says
    run(*pip, f"{wheel}[torch]", cwd=root)
    return venv / "bin"


HOT_PATH = "import cirron as ci; ci.profile(output='none'); print(ci.health()['hot_path'])"


def test_the_wheel_runs_the_compiled_hooks_unless_told_not_to(installed, tmp_path):
    assert run(installed / "python", "-c", HOT_PATH, cwd=tmp_path).stdout.strip() == "compiled"
    pure = run(installed / "python", "-c", HOT_PATH, cwd=tmp_path, CIRRON_PURE_PYTHON="1")
    assert pure.stdout.strip() == "python (CIRRON_PURE_PYTHON=1)"


def test_the_sdist_installs_with_no_compiler_and_runs_the_pure_hooks(installed, tmp_path):
    (sdist,) = (installed.parents[1] / "dist").glob("cirron_otel-*.tar.gz")
    # A compiler that fails: building the extension fails, and the install only falls back.
    target = tmp_path / "from-sdist"
    run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
        "--target", target, sdist, cwd=tmp_path, CC="false", LDSHARED="false")  # fmt: skip
    assert not list(target.glob("cirron/recording/_hot*"))  # neither built nor its source
    result = run(installed / "python", "-c", HOT_PATH, cwd=tmp_path, PYTHONPATH=str(target))
    assert result.stdout.strip() == "python (the compiled helper is not built in this install)"


def test_the_demo_runs_from_the_wheel_with_no_warning_and_every_span_closed(installed, tmp_path):
    shutil.copy(ROOT / "examples" / "train_torch.py", tmp_path / "train.py")
    result = run(installed / "python", "train.py", cwd=tmp_path)
    assert "Failed to initialize NumPy" not in result.stderr
    assert result.stderr.strip() == "", result.stderr
    tree = result.stdout.split("\n\n")[0]
    assert tree.startswith("cirron.session - ") and " open" not in tree
    assert "The spool is in .cirron/spool/" in result.stdout.splitlines()[-1]
    assert "show --diagnose" in result.stdout.splitlines()[-1]


def test_the_cirron_command_is_installed(installed, tmp_path):
    assert "show" in run(installed / "cirron", "--help", cwd=tmp_path).stdout
    assert run(installed / "cirron", "--version", cwd=tmp_path).stdout.strip() == (
        f"cirron {__version__}"
    )


def test_a_zero_code_run_finds_the_entry_points(installed, tmp_path):
    (tmp_path / "job.py").write_text("print('TRAINED')\n")
    result = run(
        installed / "opentelemetry-instrument", installed / "python", "job.py",
        cwd=tmp_path, OTEL_TRACES_EXPORTER="cirron_stdout",
    )  # fmt: skip
    assert "[cirron] cirron.session" in result.stdout
    assert [s["name"] for s in spool_spans(str(tmp_path / ".cirron"))] == ["cirron.session"]
