"""qpa's environments as MCP servers: a task session's tools, prompt and verification for any
MCP-capable agent (`qpa mcp serve`), and the scoring of such agents on a suite (`qpa mcp bench`)."""
