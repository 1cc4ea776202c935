"""IPC experiments: wire formats, the shared-memory ring, the tensor-parallel broadcast: `python -m bench.ipc.<name>`."""
