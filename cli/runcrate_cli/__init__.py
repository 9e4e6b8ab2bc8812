"""The `runcrate` command and its MCP server: clients of the public API (`/api/v1/`) over HTTP.

Nothing here imports Django or the server's apps; everything goes through `client.ApiClient`,
so the CLI and the MCP server see exactly what any other API client sees (docs/cli.md,
docs/mcp.md).
"""
