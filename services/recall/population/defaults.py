"""A sensible starting point for a realm's population: two base roles that hand work to each
other, and separate author and reviewer (a realm owner may change any of it by superseding the
constitution)."""

from __future__ import annotations

from services.recall.artifacts.kind_schemas import CHARTER_PREFIX, CONSTITUTION_PATH, REGISTRY_PATH, Charter, Constitution, RolePolicy

BASE_ROLES = {
    "researcher": RolePolicy(
        description="Investigates the realm's objects, keeps a worklog per agent and leaves handoffs.",
        may=["start", "create_draft", "append", "submit", "propose_admission"],
        may_write_kinds=["worklog", "handoff", "dossier", "decision", "strategy"]),
    "reviewer": RolePolicy(
        description="Reviews proposals (search_memory_artifacts with status=proposed) and accepts them, or rejects them "
                    "(revoke_memory_artifact with the reason: what is missing); keeps review protocols.",
        may=["start", "create_draft", "append", "submit", "accept", "revoke"],
        may_write_kinds=["worklog", "handoff", "review_protocol"]),
}

CHARTERS = {
    "researcher": Charter(
        role="researcher",
        purpose="Study the objects you are assigned to and leave accepted, checkable memory about them.",
        duties=["At start, read the constitution and your registry entry, and check that you may start.",
                "Restore your working state from your sources before doing anything new.",
                "Append to your worklog after each step: what you did, what you found, what is open.",
                "Never present a hypothesis as a fact; cite the evidence.",
                "Before you stop, leave a handoff: done, confirmed, open, evidence, next step."],
        must_read=[CONSTITUTION_PATH, REGISTRY_PATH],
        sources=["agents/{principal}/handoff", "agents/{principal}/worklog"],
        handoff_path="agents/{principal}/handoff"),
    "reviewer": Charter(
        role="reviewer",
        purpose="Keep shared memory trustworthy: accept only what is anchored, sourced and consistent.",
        duties=["Find proposals with search_memory_artifacts(status=\"proposed\"); read them in full, with their targets and sources.",
                "Accept nothing you wrote yourself (separate author and reviewer).",
                "Reject what cannot be accepted with revoke_memory_artifact and a reason saying what is missing.",
                "Record what you checked in a review protocol when a decision is at stake."],
        must_read=[CONSTITUTION_PATH, REGISTRY_PATH],
        sources=["agents/{principal}/worklog"],
        handoff_path="agents/{principal}/handoff"),
}


def default_constitution(realm_id: str, separate_author_and_reviewer: bool) -> Constitution:
    return Constitution(title=f"Constitution of realm {realm_id}", separate_author_and_reviewer=separate_author_and_reviewer,
                        roles=BASE_ROLES)


def charter_path(role: str) -> str:
    return CHARTER_PREFIX + role
