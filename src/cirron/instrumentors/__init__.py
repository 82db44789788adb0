"""Framework instrumentors: each an OpenTelemetry ``BaseInstrumentor``.

They depend on the core (scopes, marks, the guard), never the other way, and
never on each other. ``cirron.registry`` lists them by import path; each is
imported only once its framework has been imported by the user's program.
"""
