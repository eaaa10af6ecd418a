"""Inference engines: SGLang protocol, HTTP client, embedded CPU engine."""
