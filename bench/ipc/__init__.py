"""IPC experiments: wire formats, the shared-memory ring, the tensor-parallel broadcast: `python -m rill.bench.ipc.<name>`."""
