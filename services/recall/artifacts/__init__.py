"""Memory artifacts (seed 004): reviewed, versioned agent documents anchored to objects.

- models.py: the artifact, its targets, entries and audit events;
- rules.py: kinds and write modes, the lifecycle, who may do what (pure functions);
- artifact_store.py: the one data-access layer (SQLite by default, PostgreSQL for replicas);
- artifact_search.py: accepted artifacts indexed by the project's engine, one memory per realm;
- service.py: the operations, each one transaction;
- tools.py: the MCP tools, with seed 004's names and arguments.
"""
