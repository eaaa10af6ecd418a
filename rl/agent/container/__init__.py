"""The container backend (docs/containers.md): task images built from each task's Dockerfile
(``images.py``), trials in containers under the local sandbox's rules (``trial.py``,
``backend.py``), base-image stand-ins for registry-less hosts (``seed.py``), and the runtime
client with labels and reaping (``runtime.py``)."""
