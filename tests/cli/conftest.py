from tests.cli.kit import account, clock, env, sim, ticker  # noqa: F401 - fixtures
