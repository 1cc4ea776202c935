"""The processes around the API workers: the `rill` CLI, the launcher, the headless node, the engine monitor and systemd."""
