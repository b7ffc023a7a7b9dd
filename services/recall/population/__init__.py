"""The agent population of a realm (seed 004): its constitution, agent registry and charters,
kept as memory artifacts of their own kinds (so versioning, review and audit come for free).

- defaults.py: the default constitution and base roles with their charters;
- service.py: init_population, reading agents, the preliminary rule check, admission proposals;
- tools.py: the MCP tools.
"""
