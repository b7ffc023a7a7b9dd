"""`recall demo`: post a few example conversations to a running stack, then recall from them."""

from __future__ import annotations

import asyncio
import os
import time

import httpx

from services.dev_secrets import export_defaults

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


def run_demo(user: str) -> int:
    export_defaults(create=False)
    from services.recall.settings import RecallSettings
    from services.recall.tokens import mint_dev_token

    s = RecallSettings()
    ingest = f"http://127.0.0.1:{os.environ.get('RECALL_INGEST_PORT', '8001')}"
    for cid, (day, turns) in CONVERSATIONS.items():
        body = {"user": user, "conversation_id": cid,
                "turns": [{"role": role, "text": text, "ts": f"{day}T09:{i:02d}:00Z"} for i, (role, text) in enumerate(turns)]}
        resp = httpx.post(f"{ingest}/turns", json=body, headers={"x-ingest-key": os.environ["RECALL_INGEST_KEY"]}, timeout=10)
        resp.raise_for_status()
        print(f"posted {cid}: {resp.json()}")
    return asyncio.run(_ask(s, user, mint_dev_token(s, user)))


async def _ask(s, user: str, token: str) -> int:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    from shared.recall_answer_format import NO_MEMORY

    async with Client(f"http://127.0.0.1:{s.recall_port}/mcp", auth=BearerAuth(token)) as client:
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
