"""OpenTelemetry plumbing: what cirron adds to the SDK, and nothing about training.

Holds the provider set-up (``provider``), the resource (``resource``), trace and
span ids (``ids``), the lean span (``spans``, the one module that reaches
OpenTelemetry's private names), the ring-buffer span processor
(``processor``) and the in-memory store behind ``ci.trace()`` (``store``), the
health counters (``health``), attribute values (``values``), every environment
variable the package reads (``environment``) and the package version.

May import: the OpenTelemetry API and SDK, and modules of this package. Every
other package of cirron builds on this one; it imports none of them.
"""
