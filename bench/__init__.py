"""The benchmark harness and load generator of `make bench` (`python -m bench`): outside every
product package, which none of them imports (docs/benchmarks.md)."""
