"""The documentation's generated pages, checked without building the site.

``docs/gen_pages.py`` writes the settings, span contract and command pages from the code at
build time (``mkdocs build --strict`` in scripts/test.sh builds the whole site); here, that the
settings page has a row for every setting ``ci.profile()`` resolves, the contract every name, and
the benchmarks' tables (``python -m benchmarks --write-docs``) are markdown the pages can include.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cirron import config
from cirron.otel import semconv

ROOT = Path(__file__).resolve().parents[1]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_pages", ROOT / "docs" / "gen_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_the_settings_page_has_a_row_for_every_setting_with_its_variable():
    page = generator().settings_page()
    rows = {
        m.group(1): line for line in page.splitlines() if (m := re.match(r"\| `(\w+)` \|", line))
    }
    for setting, (_validate, variable, _parse) in config._RULES.items():
        assert setting in rows, f"{setting} is missing from the settings page"
        assert f"`{variable}`" in rows[setting]
    assert "enabled" in rows


def test_the_span_contract_lists_every_name_of_the_vocabulary():
    page = generator().spans_page()
    for name, value in vars(semconv).items():
        if name.isupper() and isinstance(value, str):
            assert f"`{value}`" in page, name


def test_a_benchmark_writes_its_rows_as_a_markdown_table_without_empty_columns():
    from benchmarks.table import Row, markdown_table

    table = markdown_table(
        [Row("empty ci.scope", 2_000.0, "SDK span", 10_000.0), Row("  its RSS", 7.0, unit="MB")],
        "reference",
    )
    lines = table.splitlines()
    assert lines[0] == "| operation | cirron | spread | baseline (same run) | baseline | ratio |"
    assert lines[2] == "| empty ci.scope | 2.00 us |  | SDK span | 10.00 us | 0.20x |"
    assert lines[3].startswith("| &nbsp;&nbsp;its RSS | 7.00 MB |")  # a sub-row stays indented


def test_a_link_to_a_page_the_site_leaves_out_fails_the_strict_build(tmp_path):
    """MkDocs logs such a link at INFO only (a 404 on the built page); the hook makes it a
    warning, so ``--strict`` fails on it."""
    docs = tmp_path / "docs"
    (docs / "tables").mkdir(parents=True)
    (docs / "tables" / "figures.md").write_text("| a |\n| - |\n| 1 |\n")
    (docs / "index.md").write_text("# Home\n\nSee [the figures](tables/figures.md).\n")
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\ndocs_dir: docs\nexclude_docs: |\n  tables/\n"
        f"hooks:\n  - {ROOT / 'docs' / 'gen_pages.py'}\n"
    )
    # (Not --quiet: it silences the warnings --strict counts, and the build passes.)
    mkdocs = [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict"]
    result = subprocess.run(mkdocs, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Doc file 'index.md' links to 'tables/figures/', which is not on the site" in (
        result.stderr
    )


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Counts, once laid out, the code blocks whose lines are wider than the block (cut off).
OVERFLOW = """<script>addEventListener("load", () => {
  const cut = [...document.querySelectorAll("pre > code")]
    .filter((code) => code.scrollWidth > code.clientWidth + 1).length;
  document.body.insertAdjacentHTML("beforeend", `<p id="cut-code-blocks">${cut}</p>`);
});</script></body>"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh)")
def test_no_code_block_is_cut_at_the_width_of_the_page_in_a_browser(tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", site],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=True,
        capture_output=True, timeout=300,
    )  # fmt: skip
    for page in ("index.html", "guide/pytorch/index.html", "guide/viewing/index.html"):
        probed = site / page.replace("index.html", "probed.html")
        probed.write_text((site / page).read_text().replace("</body>", OVERFLOW, 1))
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1280,900", "--virtual-time-budget=5000", "--dump-dom",
             probed.as_uri()],
            capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip
        assert '<p id="cut-code-blocks">0</p>' in dom, (page, dom[-300:])
