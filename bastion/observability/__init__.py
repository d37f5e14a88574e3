"""Seeing what the gateway does from outside: Prometheus metrics, OpenTelemetry traces, structured logs and the
health endpoints (docs/operations.md). Each is an interceptor on the one chain or a reader of the gateway's state;
none is a second path a message could take."""
