"""The kernel: what every app may import and that imports no app (money, durations, errors,
text, sql, the cache and broker, the API toolkit, outages and health). The project that mounts
the apps is `config/` (docs/architecture.md, "Layers")."""
