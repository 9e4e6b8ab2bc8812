"""The cluster agent: `runcrate_agent.py` runs on every node (stdlib only); `service` holds the
functions its HTTP endpoints call, and that the simulated data center calls too."""
