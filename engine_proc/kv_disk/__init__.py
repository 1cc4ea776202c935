"""--kv-cache-disk: the prefix cache's full blocks kept on disk, so that a restart starts warm (docs/kv-disk.md)."""
