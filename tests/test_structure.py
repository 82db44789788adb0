"""The package's shape, checked: one direction of imports, and OpenTelemetry's privates in one place.

Read from the source with ``ast`` (every import counts, also one inside a
function), so a newcomer's change that bends the structure fails here first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cirron"
FRAMEWORKS = ("torch", "tensorflow", "keras", "transformers", "lightning", "trainloop", "sklearn")


def module_name(path: Path) -> str:
    parts = ("cirron", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in SRC.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """Every module ``name`` imports, from anywhere in its source (functions too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import x` imports the module x when there is one
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return found


def internal_graph() -> dict[str, set[str]]:
    return {name: {m for m in imports_of(name) if m in MODULES and m != name} for name in MODULES}


def test_no_module_imports_itself_back_even_from_inside_a_function():
    graph = internal_graph()
    cycles = []

    def visit(node: str, path: list[str], seen: set[str]) -> None:
        for target in sorted(graph[node]):
            if target == path[0]:
                cycles.append(" -> ".join([*path, target]))
            elif target not in seen and target > path[0]:  # each cycle once, from its least name
                seen.add(target)
                visit(target, [*path, target], seen)

    for start in sorted(graph):
        visit(start, [start], {start})
    assert cycles == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if ".instrumentors" not in n))
def test_the_core_and_the_exporters_never_import_a_framework(name):
    frameworks = {m for m in imports_of(name) if m.split(".")[0] in FRAMEWORKS}
    assert frameworks == set(), f"{name} imports {frameworks}"


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if n.startswith("cirron.instrumentors."))
)
def test_an_instrumentor_imports_no_other_framework_adapter(name):
    own = name.rpartition(".")[2].split("_")[0]  # torch_steps, torch_snapshot belong to torch
    others = {
        m
        for m in imports_of(name)
        if m.startswith("cirron.instrumentors.") and m.rpartition(".")[2].split("_")[0] != own
    }
    assert others == set()


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("cirron.exporters")))
def test_exporters_depend_on_the_core_only(name):
    assert {m for m in imports_of(name) if m.startswith("cirron.instrumentors")} == set()


# Names OpenTelemetry keeps private that cirron relies on: reached from cirron.otel.spans only.
OTEL_PRIVATE = (
    "_RUNTIME_CONTEXT",
    "_current_context",
    "_SPAN_KEY",
    "_active_span_processor",
    "_span_processors",
    "_TRACER_PROVIDER",
    "_readable_span",
    "_instrumentation_scope",
    "BoundedList",
    "util._once",
    "_batch_processor",
)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "cirron.otel.spans"))
def test_opentelemetry_private_names_are_reached_from_one_module(name):
    text = MODULES[name].read_text()
    assert [private for private in OTEL_PRIVATE if private in text] == []
    private_imports = [
        alias.name
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private_imports == []


# -- the packages and their one direction ------------------------------------------------------
# Lowest first: a module may import its own package's modules and those of a package ranked
# below its own, never above (README "Architecture"). The top-level modules other than
# config and registry are the face: they assemble everything, and nothing imports them.
RANKS = {
    "cirron.otel": 0,  # OpenTelemetry plumbing
    "cirron.registry": 1,  # framework facts
    "cirron.config": 2,  # the settings
    "cirron.exporters": 3,  # sinks and the spool's format
    "cirron.metrics": 4,  # OpenTelemetry metrics from the spans, the system sampler
    "cirron.recording": 4,  # the hot path
    "cirron.training": 5,  # training moments
    "cirron.offline": 5,  # reading a trace after the fact
    "cirron.inference": 5,  # ci.inference, LLM calls as GenAI spans, content capture
    "cirron.snapshots": 6,
    "cirron.instrumentors": 7,
    "face": 8,  # cirron, profiler, lifecycle, zero_code, wrap, __main__
}
FACE = {"cirron", "cirron.__main__", "cirron.profiler", "cirron.lifecycle", "cirron.zero_code",
        "cirron.wrap"}  # fmt: skip


def unit(name: str) -> str:
    """The package (or top-level module) ``name`` belongs to, as RANKS names it."""
    if name in FACE:
        return "face"
    parts = name.split(".")
    return ".".join(parts[:2])


def test_every_module_belongs_to_a_ranked_package():
    assert {name: unit(name) for name in MODULES if unit(name) not in RANKS} == {}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_from_a_package_above_its_own(name):
    own = unit(name)
    upward = sorted(
        target
        for target in internal_graph()[name]
        if unit(target) != own and RANKS[unit(target)] >= RANKS[own]
    )
    assert upward == [], f"{name} ({own}) imports from a package at or above its own: {upward}"


@pytest.mark.parametrize(
    "package", sorted(p for p in RANKS if p.count(".") == 1 and (SRC / p.split(".")[1]).is_dir())
)
def test_each_package_says_what_it_holds_and_what_it_may_import(package):
    doc = ast.get_docstring(ast.parse((SRC / package.split(".")[1] / "__init__.py").read_text()))
    assert doc and "May import" in doc, package


@pytest.mark.parametrize(
    "name",
    sorted(n for n in MODULES if unit(n) not in ("cirron.metrics", "face")),
)
def test_only_the_face_imports_metrics_the_hot_path_never_records_one(name):
    assert {m for m in imports_of(name) if m.startswith("cirron.metrics")} == set()
