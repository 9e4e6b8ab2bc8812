"""Cluster software (Slurm, Kubernetes, Ray): the readiness checks that parse real command
output, and the simulated data center's outputs in the same formats."""

# The Ray that install-ray.sh puts in its virtualenv on ssh hosts, from the location's
# pip_index_url (the lab's index mirrors the same: lab.hostlab.PYPI_PACKAGES).
RAY_VERSION = "2.60.0"
RAY_REQUIREMENT = f"ray[default]=={RAY_VERSION}"
