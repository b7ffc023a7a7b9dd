"""The recall service: the MCP tool `recall_my_conversations`, tenant from the verified token."""
