"""`python -m rill.bench.peers`: runs bench/peers/run.py."""
from rill.bench.peers.run import main

main()
