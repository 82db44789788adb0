"""The OpenTelemetry resource of a profiled process.

``service.name`` defaults to the script's file name; ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` win over everything cirron derives, as they do in
any OpenTelemetry SDK.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from . import environment as env
from . import semconv

_INSTANCE_NAMESPACE = uuid.UUID("6f1c3a52-7d0e-4c55-9a57-3c1b6f0e2a10")


def default_service_name() -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    name = os.path.splitext(os.path.basename(script))[0]
    return name or "python"


def _int_from_environment(variable: str) -> int | None:
    text = os.environ.get(variable, "").strip()
    try:
        return int(text) if text else None
    except ValueError:
        return None


def run_id() -> str | None:
    """The run this process belongs to: ``CIRRON_RUN_ID``, else torchrun's rendezvous id.

    torchrun sets ``TORCHELASTIC_RUN_ID=none`` when no ``--rdzv-id`` was given:
    that names no run (every such run would share it).
    """
    ours = os.environ.get(env.CIRRON_RUN_ID, "").strip()
    if ours:
        return ours
    elastic = os.environ.get(env.TORCHELASTIC_RUN_ID, "").strip()
    return elastic if elastic and elastic.lower() != "none" else None


def resource_attributes() -> dict[str, Any]:
    """What cirron knows about this process, before the standard variables apply."""
    attributes: dict[str, Any] = {semconv.SERVICE_NAME: default_service_name()}
    for key, variable in (
        (semconv.RANK, env.RANK),
        (semconv.LOCAL_RANK, env.LOCAL_RANK),
        (semconv.WORLD_SIZE, env.WORLD_SIZE),
    ):
        value = _int_from_environment(variable)
        if value is not None:
            attributes[key] = value
    for key, variable in (
        (semconv.PIPELINE_ID, env.CIRRON_PIPELINE_ID),
        (semconv.DEPLOYMENT_ID, env.CIRRON_DEPLOYMENT_ID),
        (semconv.WORKSPACE_ID, env.CIRRON_WORKSPACE_ID),
    ):
        if os.environ.get(variable):
            attributes[key] = os.environ[variable]
    run = run_id()
    if run:
        attributes[semconv.RUN_ID] = run
        # Stable per run and rank: a restarted rank keeps its identity.
        rank = attributes.get(semconv.RANK, 0)
        attributes[semconv.SERVICE_INSTANCE_ID] = str(
            uuid.uuid5(_INSTANCE_NAMESPACE, f"{run}/{rank}")
        )
    else:
        attributes[semconv.SERVICE_INSTANCE_ID] = str(uuid.uuid4())
    try:
        attributes[semconv.HOST_NAME] = socket.gethostname()
    except OSError:
        pass
    attributes[semconv.PROCESS_PID] = os.getpid()
    return attributes


def build_resource() -> Resource:
    # Resource.create() lets its argument win; merging the environment
    # detector again puts OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES on top.
    return Resource.create(resource_attributes()).merge(OTELResourceDetector().detect())
