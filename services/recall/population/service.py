"""Population operations on top of the artifact service: the constitution, the registry and the
charters are accepted artifacts at fixed paths; admitting an agent is a new registry version
proposed by a member and accepted by an owner, like any reviewed change."""

from __future__ import annotations

import time
import uuid
from typing import Any

from services.recall.artifacts import rules
from services.recall.artifacts.kind_schemas import (CONSTITUTION_PATH, PLACEHOLDER, PRINCIPAL, REGISTRY_PATH, AgentRegistry,
                                                    Charter, Constitution, RegistryEntry, agent_refusals, dump, fill_path,
                                                    parse_stored_body, principal_segment)
from services.recall.artifacts.artifact_store import Conflict, Head, Tx
from services.recall.artifacts.models import PRINCIPAL_MAX, Artifact, DraftInput, Role, Status, Target, rfc3339
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import ArtifactService, Caller, check_page
from services.recall.population.defaults import CHARTERS, charter_path, default_constitution


ROLE_NAME_MAX = 40  # as kind_schemas.ROLE_NAME
AGENTS_PAGE = 20  # agents listed (each with its charter and sources resolved) unless asked for another page


class PopulationService:
    def __init__(self, artifacts: ArtifactService) -> None:
        self.artifacts = artifacts
        self.store = artifacts.store

    # ---- initialisation (owners) ---------------------------------------------------------------------
    def init_population(self, caller: Caller, realm_id: str, separate_author_and_reviewer: bool = True) -> dict[str, Any]:
        """The default constitution, an empty registry and a charter per role, accepted at once; in a
        realm whose owner wrote the constitution by hand, whatever is missing next to it (the
        registry, the charters of its base roles): the admission tools send owners here."""
        if rules.role_in(caller.realms, realm_id) is not Role.OWNER:
            raise RuleBroken("realm_role", "init_population is for realm owners")
        already = RuleBroken("population", f"realm {realm_id!r} already has a constitution and a registry; change them "
                             "with new versions")
        try:
            with self.store.transaction() as tx:
                existing = self.store.accepted_at_path(tx, realm_id, CONSTITUTION_PATH, lock=True)
                if existing is not None and self.store.accepted_at_path(tx, realm_id, REGISTRY_PATH) is not None:
                    raise already
                constitution: Constitution = parse_stored_body("constitution", existing.body) if existing else \
                    default_constitution(realm_id, separate_author_and_reviewer)  # type: ignore[assignment]
                documents = self._missing_documents(tx, realm_id, constitution, written=existing is not None)
                if not documents:  # another owner's init committed between the reads above (READ COMMITTED)
                    raise already
                made = [self._accepted(tx, caller, realm_id, *doc) for doc in documents]
                self.store.mark_for_index(tx, realm_id, [a.artifact_id for a in made])
                charters = self.store.accepted_heads(tx, realm_id, [charter_path(role) for role in constitution.roles])
        except Conflict:  # another owner initialised it at the same moment (the one-accepted-version index)
            raise already from None
        self.artifacts.index_queue.soon(realm_id)
        return {"realm_id": realm_id, "created": [{"artifact_kind": a.artifact_kind, "artifact_path": a.artifact_path,
                                                   "artifact_id": a.artifact_id} for a in made],
                "roles_without_charter": [r for r in constitution.roles if charter_path(r) not in charters]}

    def _missing_documents(self, tx: Tx, realm_id: str, constitution: Constitution, written: bool) -> list[tuple[str, str, str, str]]:
        """(kind, path, body, summary) of each population document the realm lacks: a charter only
        for a base role (a hand-written role's charter is its owner's to write)."""
        documents = [] if written else [("constitution", CONSTITUTION_PATH, dump(constitution),
                                         "The realm's constitution: roles, what each may do, review rules.")]
        documents.append(("agent_registry", REGISTRY_PATH, dump(AgentRegistry()),
                          "The agent registry: who may work in this realm, in which role."))
        documents += [("charter", charter_path(role), dump(CHARTERS[role]), f"Charter of the {role} role: purpose, duties, sources.")
                      for role in constitution.roles if role in CHARTERS]
        present = self.store.accepted_heads(tx, realm_id, [path for _, path, _, _ in documents])
        return [doc for doc in documents if doc[1] not in present]

    def _accepted(self, tx: Tx, caller: Caller, realm_id: str, kind: str, path: str, body: str, summary: str) -> Artifact:
        if self.store.accepted_at_path(tx, realm_id, path) is not None:
            raise RuleBroken("population", f"{path!r} already has an accepted version")
        now = time.time()
        artifact = Artifact(artifact_id=uuid.uuid4().hex, realm_id=realm_id, artifact_path=path, artifact_kind=kind,
                            write_mode="replace", status=Status.ACCEPTED, body=body, summary=summary,
                            source_ref=f"init_population:{realm_id}", source_context={"by": caller.principal},
                            author=caller.principal, created_at=now, updated_at=now,
                            targets=[Target(target_kind="realm", target_id=realm_id)])
        self.store.insert(tx, artifact)
        self.store.record(tx, artifact.artifact_id, "created", caller.principal, via="init_population")
        self.store.record(tx, artifact.artifact_id, "accepted", caller.principal, via="init_population")
        return self.store.get(tx, artifact.artifact_id)

    # ---- reading ----------------------------------------------------------------------------------------
    def _state(self, tx: Tx, realm_id: str) -> tuple[Head, Constitution, Head, AgentRegistry]:
        heads = self.store.accepted_heads(tx, realm_id, [CONSTITUTION_PATH, REGISTRY_PATH], with_body=True)
        c, r = heads.get(CONSTITUTION_PATH), heads.get(REGISTRY_PATH)
        if c is None or r is None:
            raise RuleBroken("population", f"realm {realm_id!r} has no population yet: an owner runs init_population, which "
                             "creates whichever of the constitution and the registry is missing")
        return c, parse_stored_body("constitution", c.body), r, parse_stored_body("agent_registry", r.body)  # type: ignore[return-value]

    def list_agents(self, caller: Caller, realm_id: str, principal: str | None = None, limit: int = AGENTS_PAGE,
                    offset: int = 0) -> dict[str, Any]:
        """A page of the registry's agents, in its order, each described (charter, sources): the
        page's charters in one query and their sources in another, never their journals' entries."""
        rules.role_in(caller.realms, realm_id)
        rules.check_length("principal", principal, PRINCIPAL_MAX)
        check_page(limit, offset)
        with self.store.transaction() as tx:
            c, constitution, r, registry = self._state(tx, realm_id)
            entries = [a for a in registry.agents if principal is None or a.principal == principal]
            page = entries[offset:offset + limit]
            charter_heads = self.store.accepted_heads(tx, realm_id, [charter_path(e.role) for e in page], with_body=True)
            charters: dict[str, Charter] = {path: parse_stored_body("charter", head.body)  # type: ignore[misc]
                                            for path, head in charter_heads.items()}
            wanted = {e.principal: self._source_paths(e, charters.get(charter_path(e.role))) for e in page}
            sources = self.store.accepted_heads(tx, realm_id, [path for paths in wanted.values() for path, _ in paths])
        agents = [self._describe(e, charter_heads.get(charter_path(e.role)), charters.get(charter_path(e.role)),
                                 wanted[e.principal], sources) for e in page]
        return {"constitution_id": c.artifact_id, "registry_id": r.artifact_id,
                "roles": {name: policy.model_dump(mode="json") for name, policy in constitution.roles.items()},
                "separate_author_and_reviewer": constitution.separate_author_and_reviewer, "agents": agents,
                "agents_total": len(entries), "next_offset": offset + len(agents) if offset + len(agents) < len(entries) else None}

    @staticmethod
    def _source_paths(entry: RegistryEntry, charter: Charter | None) -> list[tuple[str, str]]:
        """(path, whose) of the agent's sources: its charter's, for itself and whom it takes over from."""
        if charter is None:
            return []
        owners = [entry.principal] + ([entry.takes_over_from] if entry.takes_over_from else [])
        return [(fill_path(template, who), who) for who in owners for template in charter.sources]

    @staticmethod
    def _describe(entry: RegistryEntry, charter_head: Head | None, charter: Charter | None,
                  source_paths: list[tuple[str, str]], found: dict[str, Head]) -> dict[str, Any]:
        """The registry entry, where its charter is, and its sources resolved to accepted artifacts."""
        sources = [{"artifact_path": path, "of": who, "artifact_id": found[path].artifact_id if path in found else None,
                    "summary": found[path].summary if path in found else None} for path, who in source_paths]
        return {**entry.model_dump(mode="json"), "charter_path": charter_path(entry.role),
                "charter_id": charter_head.artifact_id if charter_head else None,
                "handoff_path": fill_path(charter.handoff_path, entry.principal) if charter else None,
                "sources": sources}

    # ---- the preliminary rule check (a dry run) -------------------------------------------------------
    def check(self, caller: Caller, realm_id: str, action: str, principal: str | None = None,
              artifact_kind: str | None = None, agent_role: str | None = None) -> dict[str, Any]:
        rules.role_in(caller.realms, realm_id)
        rules.check_length("principal", principal, PRINCIPAL_MAX)
        rules.check_length("agent_role", agent_role, ROLE_NAME_MAX)
        who = principal or caller.principal
        with self.store.transaction() as tx:
            c, constitution, r, registry = self._state(tx, realm_id)
            reasons = self._refusals(tx, realm_id, constitution, registry, who, action, artifact_kind, agent_role)
        allowed = "allowed by the constitution"
        if registry.find(who) is None and action not in ("admit", "start"):
            allowed = (f"{who} is not in the agent registry, so the constitution's roles do not bind it: the service treats "
                       "a principal outside the registry as a person, governed by the realm role in its token alone "
                       "(give an agent its token once it is admitted)")
        if action == "accept" and constitution.separate_author_and_reviewer:
            allowed += ", except for artifacts you wrote (separate author and reviewer)"
        return {"allowed": not reasons, "principal": who, "action": action, "artifact_kind": artifact_kind,
                "reasons": reasons or [allowed], "constitution_id": c.artifact_id,
                "registry_id": r.artifact_id,
                "note": "a dry run against the constitution and registry; the realm role in the agent's token still applies"}

    def _refusals(self, tx: Tx, realm_id: str, constitution: Constitution, registry: AgentRegistry, who: str,
                  action: str, artifact_kind: str | None, agent_role: str | None) -> list[str]:
        entry = registry.find(who)
        if action == "admit":
            out = []
            if not PRINCIPAL.fullmatch(who):
                out.append(f"{who!r} is not a valid principal")
            if entry is not None:
                out.append(f"{who} is already in the registry ({entry.role}, {entry.status})")
            elif (holder := registry.paths_holder(who)) is not None:
                out.append(f"{who}'s working paths ({PLACEHOLDER} = {principal_segment(who)!r}) are those of {holder!r}; "
                           f"admit it under another principal")
            if agent_role is None or agent_role not in constitution.roles:
                out.append(f"agent_role must be one of the constitution's roles {sorted(constitution.roles)}")
            elif self.store.accepted_at_path(tx, realm_id, charter_path(agent_role)) is None:
                # As the registry's next version is refused (ArtifactService._check_charters_exist).
                out.append(f"role {agent_role!r} has no accepted charter at {charter_path(agent_role)!r} (an owner accepts "
                           "one first), so the agent could not start")
            return out
        if entry is None and action != "start":
            return []  # as ArtifactService.governed enforces: the constitution binds the agents it lists
        out = agent_refusals(constitution, registry, who, action, artifact_kind)
        if action == "start" and entry is not None and not out and \
                self.store.accepted_at_path(tx, realm_id, charter_path(entry.role)) is None:
            out.append(f"no accepted charter at {charter_path(entry.role)!r}")
        return out

    # ---- admission (a proposal an owner accepts) ------------------------------------------------------
    def propose_admission(self, caller: Caller, realm_id: str, principal: str, agent_role: str, note: str,
                          takes_over_from: str | None = None) -> Artifact:
        rules.check_can_write(rules.role_in(caller.realms, realm_id), realm_id)
        rules.check_length("principal", principal, PRINCIPAL_MAX)
        rules.check_length("agent_role", agent_role, ROLE_NAME_MAX)
        rules.check_length("takes_over_from", takes_over_from, PRINCIPAL_MAX)
        with self.store.transaction() as tx:
            _, constitution, current, registry = self._state(tx, realm_id)
            refusals = self._refusals(tx, realm_id, constitution, registry, principal, "admit", None, agent_role)
            if takes_over_from is not None and registry.find(takes_over_from) is None:
                refusals.append(f"takes_over_from: {takes_over_from} is not in the registry")
            if refusals:
                raise RuleBroken("admission", "; ".join(refusals))
        entry = RegistryEntry(principal=principal, role=agent_role, proposed_by=caller.principal,
                              proposed_at=rfc3339(time.time()), takes_over_from=takes_over_from, note=note)
        proposal = AgentRegistry(agents=[*registry.agents, entry])
        draft = DraftInput(artifact_path=REGISTRY_PATH, artifact_kind="agent_registry", write_mode="replace",
                           body=dump(proposal), summary=f"Admit {principal} as {agent_role}",
                           source_ref=f"admission:{principal}", source_context={"proposed_by": caller.principal, "note": note},
                           targets=[Target(target_kind="realm", target_id=realm_id)], supersedes_artifact_id=current.artifact_id)
        made = self.artifacts.create_draft(caller, realm_id, draft, as_action="propose_admission")
        return self.artifacts.submit(caller, realm_id, made.artifact_id)
