"""The installed recall package's version: what `recall-engine --version` and the MCP server's `serverInfo` report."""

from __future__ import annotations


def recall_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("recall")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "dev"
