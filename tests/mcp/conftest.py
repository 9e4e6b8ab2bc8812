from tests.cli.kit import account, clock, env, sim, ticker  # noqa: F401 - fixtures
from tests.mcp.kit import api_calls  # noqa: F401 - fixtures
