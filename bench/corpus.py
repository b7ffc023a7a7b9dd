"""Synthetic operations history in the style of seed 000's benchmark.

N conversations of six messages, each hiding one verifiable fact among chatter. Sites,
equipment and twelve people recur (every unit appears in about six conversations, in chatter
and in other facts), and the same symptoms and tasks repeat across units, so a question must
match a combination: often only the identifier tells the right fact from its look-alikes.
Every question has exactly one right answer; a hit is a returned passage that holds both the
answer and the unit's identifier. Deterministic for a given (n, seed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

SITES = ["North", "South", "East", "West", "Harbor", "Ridge", "Valley", "Delta", "Summit", "Bay", "Lake", "Mesa"]
PEOPLE = ["Priya", "Tomas", "Aiko", "Marek", "Fatima", "Jonas", "Lucia", "Omar", "Greta", "Ravi", "Nadia", "Sven"]
KINDS = [("pump", "P"), ("compressor", "K"), ("conveyor", "C"), ("press", "M"), ("boiler", "B"), ("mixer", "X")]
# (how the fact says it, how a question paraphrases it, the short query's key noun)
SYMPTOMS = [
    ("gland leak", "seal weeping fluid", "leak"),
    ("vibration alarm that keeps firing", "repeated shaking alerts", "vibration"),
    ("bearing noise", "grinding sound from the bearings", "bearing"),
    ("overheating motor", "motor running too hot", "overheating"),
    ("pressure drop", "falling pressure readings", "pressure"),
    ("belt slip", "drive belt slipping", "belt"),
]
TASKS = [
    ("quarterly calibration", "periodic sensor calibration", "calibration"),
    ("lubrication round", "greasing schedule", "lubrication"),
    ("safety inspection", "safety walk-through", "inspection"),
    ("spare parts order", "ordering replacement parts", "parts"),
]
OPTIONS = ["refurbish in place", "replace with a new unit", "run to failure", "move to standby duty", "upgrade the controls"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


@dataclass(frozen=True)
class Question:
    short: str
    long: str
    answer: str
    unit: str
    conversation_id: str
    # The question without the identifier (kind + site + detail); only where that combination
    # names one conversation of the corpus, else None.
    bare: str | None = None


FORMS = ("short", "long", "bare")


def with_bare_forms(questions: list[Question], keys: list[tuple], bare: list[str]) -> list[Question]:
    """Attach each bare form whose key (fact type, kind, site, detail) is unique in the corpus."""
    from collections import Counter
    from dataclasses import replace

    count = Counter(keys)
    return [replace(q, bare=b) if count[key] == 1 else q for q, key, b in zip(questions, keys, bare)]


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    started: datetime
    messages: list[str]


def _unit_name(kind: tuple[str, str], number: int) -> str:
    return f"{kind[1]}-{number:03d}"


def generate(n: int, seed: int = 7, now: datetime | None = None) -> tuple[list[Conversation], list[Question]]:
    rng = random.Random(seed)
    now = now or datetime(2026, 11, 1, tzinfo=timezone.utc)
    n_units = max(4, n // 4)  # four facts per unit (one per fact type) keep each question unique
    units = [(KINDS[i % len(KINDS)], 1 + i // len(KINDS)) for i in range(n_units)]
    names = [_unit_name(k, num) for k, num in units]
    assert len(set(names)) == len(names)
    conversations: list[Conversation] = []
    questions: list[Question] = []
    tickets = rng.sample(range(1000, 99999), n)
    keys: list[tuple] = []
    bare: list[str] = []
    for i in range(n):
        cid = f"conv-{i:05d}"
        u = i % n_units
        kind, unit = units[u][0][0], names[u]
        site = SITES[(u * 5 + i // n_units) % len(SITES)]
        other = [names[rng.randrange(n_units)] for _ in range(2)]
        other_site = SITES[rng.randrange(len(SITES))]
        person = PEOPLE[rng.randrange(len(PEOPLE))]
        fact_type = (i // n_units) % 4
        if fact_type == 0:
            sym = SYMPTOMS[rng.randrange(len(SYMPTOMS))]
            answer = f"MT-{tickets[i]}"
            ask = f"The {kind} {unit} at {site} has a {sym[0]} again."
            fact = f"I opened work order {answer} for the {sym[0]} on {kind} {unit}; {person} will pick it up."
            long_q = f"Which ticket number did we raise about the {sym[1]} on the {kind} {unit}?"
            short_q = f"{unit} {sym[2]} ticket"
            bare_q = f"Which ticket number did we raise about the {sym[1]} on the {kind} at {site} for {person}?"
            detail = (sym, person)
        elif fact_type == 1:
            rate = f"{rng.randrange(1, 99) / 10:.1f}%"
            answer = rate
            ask = f"Can you log the QC check for {kind} {unit} at {site}?"
            fact = f"Logged: QC check on {kind} {unit} found a defect rate of {rate} in this batch."
            long_q = f"What share of parts failed the quality inspection on the {kind} {unit}?"
            short_q = f"{unit} QC defect rate"
            bare_q, detail = f"What share of parts failed the quality inspection on the {kind} at {site}?", None
        elif fact_type == 2:
            task = TASKS[rng.randrange(len(TASKS))]
            day = WEEKDAYS[rng.randrange(len(WEEKDAYS))]
            answer = person
            ask = f"Who takes the {task[0]} for {kind} {unit} at {site}?"
            fact = f"{person} owns the {task[0]} for {kind} {unit}, due {day}."
            long_q = f"Who did we assign the {task[1]} of the {kind} {unit} to?"
            short_q = f"{unit} {task[2]} owner"
            bare_q, detail = f"Who did we assign the {task[1]} of the {kind} at {site}, due {day}, to?", (task, day)
        else:
            option = OPTIONS[rng.randrange(len(OPTIONS))]
            answer = f"DEC-{i:05d}"
            ask = f"We need a call on the ageing {kind} {unit} at {site}."
            fact = f"Decision {answer}: we {option} for {kind} {unit}, approved by {person}."
            long_q = f"What did we end up deciding about the old {kind} {unit}, and what is the decision reference?"
            short_q = f"{unit} decision"
            bare_q = f"What did {person} approve for the old {kind} at {site}, and what is the decision reference?"
            detail = person
        messages = [
            f"Morning. Busy day at {other_site}; {other[0]} is running fine so far.",
            f"Good morning! I can see {other[1]} on the {other_site} board too. What do you need?",
            ask,
            fact,
            f"Thanks. Remind me later to check {other[0]} as well.",
            f"Will do. Anything else for {site} today?",
        ]
        started = now - timedelta(days=rng.uniform(1, 365), minutes=rng.randrange(600))
        conversations.append(Conversation(cid, started, messages))
        questions.append(Question(short_q, long_q, answer, unit, cid))
        keys.append((fact_type, kind, site, detail))
        bare.append(bare_q)
    return conversations, with_bare_forms(questions, keys, bare)


def conversation_lines(conv: Conversation, harness: str = "copilot") -> str:
    """The conversation as a `.funes.jsonl` body."""
    from shared.engine.transcript import Block, TranscriptTurn, dump_transcript

    turns = [
        TranscriptTurn(session_id=conv.conversation_id, turn_uuid=f"{conv.conversation_id}-{s}", seq=s,
                       ts=(conv.started + timedelta(minutes=s)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       role="user" if s % 2 == 0 else "assistant", harness=harness,
                       blocks=[Block(block_type="text", text=m)])
        for s, m in enumerate(conv.messages)
    ]
    return dump_transcript(turns)


def is_hit(passages: list[str], question: Question) -> bool:
    return any(question.answer in p and question.unit in p for p in passages)
