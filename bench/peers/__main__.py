"""`python -m bench.peers`: runs bench/peers/run.py."""
from bench.peers.run import main

main()
