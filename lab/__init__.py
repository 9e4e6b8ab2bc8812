"""The host lab: real Linux hosts on one machine, for the ssh driver (docs/lab.md).

Stdlib only. `lab.hostlab` has the API; `python -m lab` the command line.
"""
