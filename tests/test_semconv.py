"""One vocabulary: every span, attribute and event name the package writes is named in
``cirron/otel/semconv.py``, and written as a literal nowhere else in ``src/``.

Read from the source with ``ast``: a name in a docstring or an f-string's text is prose;
a string literal equal to a name of the vocabulary is a name written twice, unless it is
one of the few strings listed below that only look like one (a framework's method, a
Python attribute, a field of a format).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cirron.otel import semconv

SRC = Path(__file__).resolve().parents[1] / "src"
VOCABULARY = {
    value for key, value in vars(semconv).items() if key.isupper() and isinstance(value, str)
}
# Strings equal to a name that are not the package writing that name: (file, string) -> why.
NOT_NAMES = {
    ("cirron/__init__.py", "batches"): "the public API's names",
    ("cirron/__init__.py", "epochs"): "the public API's names",
    ("cirron/__init__.py", "inference"): "the public API's names",
    ("cirron/config.py", "path"): "a setting",
    ("cirron/exporters/spool.py", "path"): "an argument named in an error message",
    ("cirron/wrap.py", "predict"): "the estimator methods it wraps",
    ("cirron/otel/values.py", "device"): "a tensor's attribute",
    ("cirron/otel/values.py", "index"): "an argument named in an error message",
    ("cirron/inference/capture.py", "shape"): "a tensor's attribute",
    ("cirron/inference/capture.py", "device"): "a tensor's attribute",
    ("cirron/inference/capture.py", "forward"): "a torch module's method",
    ("cirron/inference/capture.py", "predict"): "an estimator's method",
    ("cirron/recording/training_state.py", "index"): "a slot of a moment",
    ("cirron/recording/training_state.py", "steps"): "a slot of a moment",
    ("cirron/recording/training_state.py", "batches"): "a slot of a moment",
    ("cirron/exporters/metrics_files.py", "histogram"): "OTLP/JSON's own field",
    ("cirron/exporters/metrics_files.py", "value"): "a field of read_metrics()'s points",
    ("cirron/exporters/metrics_files.py", "kind"): "a field of read_metrics()'s points",
    ("cirron/exporters/metrics_files.py", "min"): "a field of read_metrics()'s points",
    ("cirron/exporters/metrics_files.py", "max"): "a field of read_metrics()'s points",
    ("cirron/metrics/recorded.py", "value"): "a field of ci.metrics()'s rows",
    ("cirron/metrics/recorded.py", "kind"): "a field of ci.metrics()'s rows",
    ("cirron/instrumentors/keras.py", "evaluate"): "Keras's methods",
    ("cirron/instrumentors/keras.py", "predict"): "Keras's methods",
    ("cirron/instrumentors/keras.py", "epochs"): "Keras's fit parameters",
    ("cirron/instrumentors/keras.py", "steps"): "Keras's fit parameters",
    ("cirron/instrumentors/keras_snapshot.py", "value"): "a Keras variable's attribute",
    ("cirron/instrumentors/keras_snapshot.py", "path"): "a Keras variable's attribute",
    ("cirron/instrumentors/keras_snapshot.py", "trainable"): "a Keras variable's attribute",
    ("cirron/instrumentors/lightning.py", "validate"): "the Trainer's methods",
    ("cirron/instrumentors/lightning.py", "test"): "the Trainer's methods",
    ("cirron/instrumentors/lightning.py", "predict"): "the Trainer's methods",
    ("cirron/instrumentors/torch.py", "train"): "the torch attributes it patches",
    ("cirron/instrumentors/torch.py", "backward"): "the torch attributes it patches",
    ("cirron/instrumentors/torch.py", "step"): "the torch attributes it patches",
    (
        "cirron/instrumentors/torch_modules.py",
        "module",
    ): "the attribute a wrapper keeps its model in",
    ("cirron/instrumentors/torch_modules.py", "backward"): "the patched function's name",
    ("cirron/instrumentors/torch_snapshot.py", "device"): "where a summary is computed",
    ("cirron/instrumentors/torch_steps.py", "batches"): "a slot of a loader pass",
    ("cirron/instrumentors/trainloop.py", "non_finite_grad_retries"): "trainloop's own key",
    ("cirron/instrumentors/trainloop.py", "train"): "the trainer's method",
    ("cirron/instrumentors/transformers.py", "num_train_epochs"): "the Trainer state's field",
    ("cirron/instrumentors/transformers.py", "metric_key_prefix"): "the Trainer's keyword",
    ("cirron/instrumentors/transformers.py", "train"): "the Trainer's methods",
    ("cirron/instrumentors/transformers.py", "evaluate"): "the Trainer's methods",
    ("cirron/instrumentors/transformers.py", "predict"): "the Trainer's methods",
    ("cirron/offline/cli/common.py", "path"): "the command's argument",
    ("cirron/offline/cli/watch.py", "path"): "the command's argument",
    ("cirron/offline/live_view.py", "optimizer"): "a word of the view's lines",
    ("cirron/offline/live_view.py", "steps"): "a column of the ranks' table",
    ("cirron/offline/live.py", "steps"): "a field of the index's lines",
    ("cirron/offline/live.py", "batches"): "a field of the index's lines",
    ("cirron/offline/live.py", "value"): "a field of a metrics point",
    ("cirron/offline/live.py", "kind"): "a column of the step rows",
    ("cirron/metrics/run_summary.py", "optimizer"): "a word of the summary's lines",
    ("cirron/offline/readback.py", "index"): "a field of ci.trace()'s nodes",
    ("cirron/offline/readback.py", "value"): "a field of ci.trace()'s marks",
    ("cirron/offline/readback.py", "kind"): "a field of ci.trace()'s marks",
    ("cirron/offline/findings.py", "eval"): "a prefix of a mark's name",
    ("cirron/offline/findings.py", "test"): "a prefix of a mark's name",
    ("cirron/offline/findings.py", "epoch"): "a prefix of a mark's name",
    ("cirron/offline/step_findings.py", "step"): "a word of a finding's sentence",
    ("cirron/offline/resource_findings.py", "epoch"): "a word of a finding's sentence",
    ("cirron/offline/rank_findings.py", "step"): "a word of a finding's sentence",
    ("cirron/offline/ranks.py", "steps"): "a column of the ranks' table",
    ("cirron/offline/resource_findings.py", "epochs"): "a word of a finding's sentence",
    ("cirron/exporters/otlp_json_decoder.py", "value"): "OTLP/JSON's own field",
    ("cirron/offline/chrome.py", "value"): "OTLP/JSON's own field",
    ("cirron/offline/chrome.py", "kind"): "OTLP/JSON's own field",
    ("cirron/instrumentors/keras_custom_loops.py", "train"): "what a tf.function turned out to be",
    ("cirron/instrumentors/keras_custom_loops.py", "eval"): "what a tf.function turned out to be",
    ("cirron/instrumentors/keras_custom_loops.py", "gradient"): "the patched method's name",
    ("cirron/exporters/otlp_json_decoder.py", "kind"): "OTLP/JSON's own field",
    ("cirron/exporters/spool_index.py", "index"): "the index's folder",
    ("cirron/exporters/spool_index.py", "steps"): "a field of the index's lines",
    ("cirron/exporters/spool_index.py", "batches"): "a field of the index's lines",
    ("cirron/exporters/spool_index.py", "epoch"): "a field of the index's lines",
    ("cirron/offline/live.py", "epoch"): "a field of the index's lines",
    ("cirron/offline/run_index.py", "steps"): "a field of the index's lines",
    ("cirron/offline/run_index.py", "batches"): "a field of the index's lines",
    ("cirron/exporters/step_rows.py", "index"): "a column of the step rows",
    ("cirron/exporters/step_rows.py", "kind"): "a column of the step rows",
    ("cirron/exporters/step_rows.py", "value"): "a column of the step rows' marks",
    ("cirron/offline/step_table.py", "index"): "a column of the step rows",
    ("cirron/offline/step_table.py", "kind"): "a column of the step rows",
    ("cirron/offline/step_table.py", "value"): "a field of a row's mark",
    ("cirron/offline/step_table.py", "steps"): "a field of the index's lines",
    ("cirron/offline/step_table.py", "batches"): "a field of the index's lines",
    ("cirron/offline/outline.py", "step"): "a word of the outline's lines",
    ("cirron/offline/outline.py", "steps"): "a word of the outline's lines",
    ("cirron/offline/outline.py", "batch"): "a word of the outline's lines",
    ("cirron/offline/outline.py", "batches"): "a word of the outline's lines",
    ("cirron/offline/outline.py", "epoch"): "a word of the outline's lines",
    ("cirron/offline/outline.py", "epochs"): "a word of the outline's lines",
}
# Calls that write a span, attribute or event name as their first argument.
WRITERS = {"open_span", "open_on", "open_hook", "begin_pass", "record_on", "set_attribute",
           "add_event", "add_mark_event", "defer_attribute", "start_span", "begin"}  # fmt: skip
MODULES = sorted(p for p in (SRC / "cirron").rglob("*.py") if p.name != "semconv.py")


def literals(path: Path) -> list[ast.Constant]:
    """The string literals of ``path`` that are code, not prose (docstrings, f-string text)."""
    tree = ast.parse(path.read_text())
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                prose.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            prose.update(id(value) for value in node.values)
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_name_of_the_vocabulary_is_written_as_a_literal(path):
    where = str(path.relative_to(SRC))
    twice = [
        f"{where}:{node.lineno}: {node.value!r}"
        for node in literals(path)
        if node.value in VOCABULARY and (where, node.value) not in NOT_NAMES
    ]
    assert twice == [], "use the name from cirron.otel.semconv"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_span_or_attribute_is_named_by_a_literal_where_it_is_written(path):
    tree = ast.parse(path.read_text())
    written = [
        f"{path.relative_to(SRC)}:{node.lineno}: {node.args[0].value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) in WRITERS
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]
    assert written == [], "name it in cirron.otel.semconv"


def test_the_exceptions_above_still_exist():
    """Each entry of NOT_NAMES is still needed (a stale one would hide a real name)."""
    found = {
        (str(path.relative_to(SRC)), node.value)
        for path in MODULES
        for node in literals(path)
        if node.value in VOCABULARY
    }
    assert set(NOT_NAMES) - found == set()
