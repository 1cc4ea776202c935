"""The load generator `rill bench` ships (serve, compare, sweep) and what every benchmark shares: servers, reports."""
