"""`recall demo`: post a few example conversations to a running stack, then recall from them."""

from __future__ import annotations

import argparse
import asyncio
import time

from services.cli_problem import Problem
from services.config_check import load_settings
from services.dev_secrets import require
from services.stack_state import read_info

CONVERSATIONS = {
    "ops-2026-10-03": ("2026-10-03", [
        ("user", "Handover for the night shift: the K-2 machine keeps tripping on the North line."),
        ("assistant", "Noted. I opened maintenance ticket MT-4471 for the K-2 machine; Priya from integrations owns it."),
        ("user", "Good. Nothing else changes tonight."),
    ]),
    "ops-2026-10-08": ("2026-10-08", [
        ("user", "Let's settle the N-11 upgrade. Expected load is about 2185 of 2400 units/day."),
        ("assistant", "That is 91%: acceptable but tight. Decision: proceed with the N-11 upgrade once MT-4471 is closed."),
        ("user", "Agreed, schedule it after MT-4471."),
    ]),
    "forecast-2026-10-12": ("2026-10-12", [
        ("user", "Which forecast scenario do we use as the base case for the budget?"),
        ("assistant", "Base case: hyperbolic decline, q0 1500 units/day, Di 0.25/yr, b 0.6 — 1069.5 units/day at 18 months."),
    ]),
}
QUESTIONS = ["N-11 upgrade decision", "MT-4471 K-2 machine ticket owner", "base case forecast parameters", "P-7 motor"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("demo", parents=[common], help="post example conversations to a running stack and recall from them",
                       description=__doc__)
    p.add_argument("--user", default="demo-user", help="whose conversations they become (default: demo-user)")
    p.set_defaults(fn=lambda args: run_demo(args.user))


def run_demo(user: str) -> int:
    import httpx

    from services.recall.tokens import mint_dev_token
    from services.stack import StackSettings, local_url

    data_dir = load_settings(StackSettings).data_dir.resolve()
    require(data_dir, "demo", "RECALL_INGEST_KEY", "RECALL_JWT_SECRET")
    s = load_settings(StackSettings)
    info = read_info(data_dir)
    if (info is not None and not info.dev_tokens) or s.jwks_url:
        raise Problem("recall demo: this stack verifies RS256 tokens from RECALL_JWKS_URL, and demo can only mint HS256 "
                      "dev tokens; unset RECALL_JWKS_URL for a dev stack")
    ingest = info.ingest_url if info else local_url(s.ingest_host, s.ingest_port)
    recall = info.recall_url if info else local_url(s.recall_host, s.recall_port)
    for url, var in ((ingest, "RECALL_INGEST_PORT"), (recall, "RECALL_RECALL_PORT")):
        if _answers(f"{url}/healthz"):
            continue
        if info:
            raise Problem(f"recall demo: the recall up running for {data_dir} does not answer at {url}; see its terminal")
        raise Problem(f"recall demo: nothing answers at {url} ({var}) and no recall up is running for {data_dir}; "
                      "start the stack first (`make run`) and run this from the same directory")
    for cid, (day, turns) in CONVERSATIONS.items():
        body = {"user": user, "conversation_id": cid,
                "turns": [{"role": role, "text": text, "ts": f"{day}T09:{i:02d}:00Z"} for i, (role, text) in enumerate(turns)]}
        resp = httpx.post(f"{ingest}/turns", json=body, headers={"x-ingest-key": s.ingest_key.get_secret_value()}, timeout=10)
        if resp.status_code != 202:
            raise Problem(f"recall demo: {ingest}/turns answered {resp.status_code} {resp.text[:200]}"
                          + (" (is RECALL_INGEST_KEY the running stack's key?)" if resp.status_code == 401 else ""))
        print(f"posted {cid}: {resp.json()}")
    return asyncio.run(_ask(recall, user, mint_dev_token(s, user)))


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def _ask(recall: str, user: str, token: str) -> int:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    from shared.recall_answer_format import NO_MEMORY

    async with Client(f"{recall}/mcp", auth=BearerAuth(token)) as client:
        deadline = time.monotonic() + 60
        while True:  # the indexer needs a moment (debounce + index run)
            text = (await client.call_tool("recall_my_conversations", {"query": "forecast base case"})).content[0].text
            if text != NO_MEMORY and "1069.5" in text:
                break
            if time.monotonic() > deadline:
                print("the conversations did not become searchable within 60 s; is the indexer running?")
                return 1
            await asyncio.sleep(0.5)
        for q in QUESTIONS:
            text = (await client.call_tool("recall_my_conversations", {"query": q})).content[0].text
            print(f"\n>>> recall_my_conversations({q!r})  [as {user}]\n{text}")
    return 0
