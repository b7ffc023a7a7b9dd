"""AgentMemory (seed 004): compact typed records — a fact, an observation, a decision, a
hypothesis or historical information — with a reality characteristic and a validity period,
anchored to the realm's objects. People write them (HTTP API, `recall memory`); agents search
and read them over MCP.

- models.py: the record, its input, citations of the author's own conversation passages;
- memory_store.py: its tables in the artifacts' data-access layer (SQLite or PostgreSQL);
- citations.py: checking a cited passage, and showing it only to a reader entitled to it;
- service.py: the operations, each one transaction, each change audited;
- tools.py: the two MCP tools; http_api.py: the people's HTTP API; cli.py: `recall memory`.
"""
