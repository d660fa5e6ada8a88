"""Tools, both ways: ``definitions`` reads a request's ``tools`` / ``tool_choice`` (and the calls in
its assistant messages); ``calls`` splits the model's tool calls from its output as it streams,
using the markers and parse function of the model's ``formats`` entry (Hermes JSON or one of
mlx-lm's parsers, or the gateway's own for a remote backend's calls). Every surface uses the
same three.
"""
