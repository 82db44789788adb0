from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import cirron as ci
from cirron import registry
from support import run_python


def test_profile_imports_no_framework_the_script_does_not_use(tmp_path):
    result = run_python(
        """
        import sys
        import cirron as ci
        ci.profile(output="none")
        heavy = [m for m in ("torch", "tensorflow", "keras", "transformers") if m in sys.modules]
        print(heavy)
        assert heavy == [], heavy
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr


def test_profile_after_torch_imports_only_what_recording_needs(tmp_path):
    # What start-up must not pay for: the protobuf and network exporters nobody configured,
    # report and table libraries, and cirron's own read-back (the spool reader, ci.trace()).
    pytest.importorskip("torch")
    result = run_python(
        """
        import sys
        import torch
        before = set(sys.modules)
        import cirron as ci
        ci.profile()
        assert ci.health()["hooks"] == ["torch"]
        added = set(sys.modules) - before
        unneeded = ("google.protobuf", "grpc", "requests", "rich", "pandas",
                    "opentelemetry.exporter", "cirron.offline",
                    "cirron.exporters.spool_reader", "cirron.exporters.otlp_json_decoder")
        found = sorted(m for m in added if m.startswith(unneeded))
        print(found)
        assert found == [], found
        assert "cirron.session" in ci.trace()
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_detect_lists_installed_frameworks_by_priority():
    detected = registry.detect()
    if "torch" in sys.modules or registry._installed("torch"):
        assert "torch" in detected
    assert list(detected) == sorted(detected, key=lambda n: -registry.FRAMEWORKS[n].priority)


@pytest.fixture
def fake_framework(tmp_path, monkeypatch):
    """A real module pair: a 'framework' and an instrumentor for it."""
    (tmp_path / "fakeframework.py").write_text("VALUE = 1\n")
    (tmp_path / "fake_instrumentor.py").write_text(
        textwrap.dedent(
            """
        events = []

        class FakeInstrumentor:
            def instrument(self, **kwargs):
                events.append(("instrument", kwargs.get("tracer_provider") is not None))

            def uninstrument(self, **kwargs):
                events.append(("uninstrument",))
        """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        registry.FRAMEWORKS,
        "torch",
        registry.Framework("torch", ("fakeframework",), "fake_instrumentor:FakeInstrumentor", 1),
    )
    yield
    for name in ("fakeframework", "fake_instrumentor"):
        sys.modules.pop(name, None)


def test_instrumentor_attaches_when_the_framework_is_imported_later(fake_framework):
    import fake_instrumentor

    ci.profile(output="none", frameworks=["torch"])
    assert fake_instrumentor.events == []
    assert ci.health()["hooks"] == []
    import fakeframework  # noqa: F401

    assert fake_instrumentor.events == [("instrument", True)]
    assert ci.health()["hooks"] == ["torch"]
    assert ci.trace(format="dict")["attributes"]["framework"] == ["torch"]
    ci.shutdown()
    assert fake_instrumentor.events[-1] == ("uninstrument",)


def test_frameworks_empty_list_installs_no_hooks(fake_framework):
    import fake_instrumentor
    import fakeframework  # noqa: F401

    ci.profile(output="none", frameworks=[])
    assert fake_instrumentor.events == []


def test_a_failing_instrumentor_is_counted_not_raised(fake_framework, tmp_path):
    (tmp_path / "fake_instrumentor.py").write_text(
        "class FakeInstrumentor:\n"
        "    def instrument(self, **kwargs):\n"
        "        raise RuntimeError('hook exploded')\n"
    )
    import fakeframework  # noqa: F401

    ci.profile(output="none", frameworks=["torch"])
    report = ci.health()
    assert report["hook_errors"] == 1
    assert any("torch" in site for site in report["errors_by_site"])
    with ci.scope("training-goes-on"):
        pass


# -- the registry is the one list of frameworks ----------------------------------------------
def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def _distribution(requirement: str) -> str:
    """``"keras >= 2.15"`` -> ``"keras"``."""
    for operator in ("==", ">=", "<=", "~=", "!=", ">", "<", "["):
        requirement = requirement.split(operator)[0]
    return requirement.strip().lower().replace("_", "-")


def test_the_entry_points_are_the_registrys_instrumentors():
    declared = _pyproject()["project"]["entry-points"]["opentelemetry_instrumentor"]
    expected = {f.entry_point: f.instrumentor for f in registry.FRAMEWORKS.values()}
    missing = {name: path for name, path in expected.items() if declared.get(name) != path}
    assert not missing, "add to [project.entry-points.opentelemetry_instrumentor]: " + ", ".join(
        f'{name} = "{path}"' for name, path in missing.items()
    )
    extra = set(declared) - set(expected)
    assert not extra, f"entry points with no framework in cirron/registry.py: {sorted(extra)}"


def test_every_framework_has_an_extra_that_installs_it_and_all_holds_them_all():
    extras = _pyproject()["project"]["optional-dependencies"]
    every = {_distribution(r) for r in extras["all"]}
    for framework in registry.FRAMEWORKS.values():
        needed = _distribution(framework.requirement)
        assert framework.extra in extras, (
            f'add to [project.optional-dependencies]: {framework.extra} = ["{needed}..."]'
        )
        assert needed in {_distribution(r) for r in extras[framework.extra]}, (
            framework.name,
            needed,
        )
        assert {_distribution(r) for r in extras[framework.extra]} <= every, (
            f"[project.optional-dependencies] all lacks what {framework.extra} installs"
        )
    assert "plotly" in every  # the report's


def test_an_instrumentor_reads_its_modules_and_requirement_from_the_registry():
    for framework in registry.FRAMEWORKS.values():
        instrumentor = registry.load_object(framework.instrumentor)()
        assert instrumentor.modules == framework.modules
        assert tuple(instrumentor.instrumentation_dependencies()) == (framework.requirement,)
