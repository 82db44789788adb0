"""A small torch training run, profiled, that prints its trace tree.

    python examples/train_torch.py [--epochs 2] [--output stdout]

Spans go to ./.cirron/spool/ as OTLP/JSON, and to an OTLP backend when
OTEL_EXPORTER_OTLP_ENDPOINT is set (see docker-compose.yml for Jaeger).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cirron as ci


def make_data(samples: int = 256, features: int = 20, classes: int = 4) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, features, generator=generator)
    labels = torch.randint(0, classes, (samples,), generator=generator)
    return TensorDataset(inputs, labels)


def delivered(health: dict) -> str:
    """What each sink delivered: a backend that got nothing is no lost run when the spool
    has every span (``cirron export`` sends them later)."""
    sinks = health["sinks"]
    each = ", ".join(f"{name} {figures['exported']}" for name, figures in sinks.items())
    line = f"{health['spans_ended']} spans recorded; delivered: {each or 'no sink'}"
    spooled = sinks.get("spool", {}).get("exported", 0)
    if spooled and "otlp" in sinks and sinks["otlp"]["exported"] < spooled:
        line += ": run `cirron export` to send the spool's spans to the OTLP endpoint"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", default="spool", help="spool, log, stdout or none")
    args = parser.parse_args()

    handle = ci.profile(output=args.output)  # the one line
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    train = DataLoader(make_data(), batch_size=args.batch_size, shuffle=True)
    validation = DataLoader(make_data(64), batch_size=args.batch_size)

    # A plain PyTorch loop: the hooks find epochs, steps, forward, backward, ...
    for _epoch in range(args.epochs):
        model.train()
        for inputs, labels in train:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss.item())  # lands on this step
        model.eval()
        with torch.no_grad():  # a validation pass: the hooks make it a `validate` span
            correct = sum(
                (model(inputs).argmax(dim=1) == labels).sum().item()
                for inputs, labels in validation
            )
        ci.mark("val_accuracy", correct / 64, kind="summary")  # lands on the epoch

    ci.shutdown()  # the run is over: every span ends and is written
    print(ci.trace())
    health = handle.health()
    print(f"\n{delivered(health)}")
    if "spool" in health["sinks"]:
        print(f"The spool is in {os.path.join(handle.settings.path, 'spool')}/: {next_steps()}")


def next_steps() -> str:
    """The commands to run next, as typed here: the venv's ``cirron`` is not on the PATH until
    the venv is activated (the README writes ``cirron ...``)."""
    scripts = os.path.dirname(sys.executable)
    on_path = any(
        os.path.realpath(p) == os.path.realpath(scripts) for p in os.environ["PATH"].split(":")
    )
    cirron = "cirron" if on_path else os.path.relpath(os.path.join(scripts, "cirron"))
    said = (
        f"`{cirron} show --diagnose` says what it found, `{cirron} report -o report.html` draws it."
    )
    if not on_path:
        activate = os.path.relpath(os.path.join(scripts, "activate"))
        said += f" (After `source {activate}`, `cirron ...` works as the README writes it.)"
    return said


if __name__ == "__main__":
    main()
