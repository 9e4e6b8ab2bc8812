"""Cluster software (Slurm, Kubernetes, Ray): the readiness checks that parse real command
output, and the simulated data center's outputs in the same formats."""
