"""The wire protocol between the gateway (and CLI) and the workers: msgpack frames over ZeroMQ."""
