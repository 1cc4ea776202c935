"""The processes around the API workers: the `rill` CLI, the launcher, its engine monitor, and systemd integration."""
