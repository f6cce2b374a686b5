"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` (docs/design.md
section 10), a second front door to the same :class:`~mmserver.http.service.ModelService`
and the same batches as HTTP. ``messages`` turns its messages into the v2 operations'
bodies and back; ``server`` serves it on the HTTP server's own event loop."""
