"""Kinds whose body is structured JSON: the agent population (seed 004, "population of agents").

A realm's constitution, its agent registry and each role's charter are ordinary replace-mode
artifacts, so they get versioning, review and audit like any decision; their bodies must
validate against the models below (checked when a draft is created, edited or superseded).
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from services.recall.artifacts.artifact_store import DamagedRow
from services.recall.artifacts.models import ARTIFACT_PATH
from services.recall.artifacts.rules import WRITE_MODE, RuleBroken, shown

CONSTITUTION_PATH = "population/constitution"
REGISTRY_PATH = "population/registry"
CHARTER_PREFIX = "population/charters/"
ROLE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
# A token's sub in any script (its path segment, principal_segment, keeps only [a-z0-9._-]).
PRINCIPAL = re.compile(r"[^\W_][\w.@:-]{0,127}")

# What an agent may do under the constitution (the preliminary check answers for these).
Action = Literal["start", "create_draft", "append", "submit", "accept", "revoke", "propose_admission"]
# The preliminary check also answers "would this agent be admitted?".
CheckAction = Literal["admit", "start", "create_draft", "append", "submit", "accept", "revoke", "propose_admission"]
AgentStatus = Literal["active", "suspended", "retired"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolePolicy(Strict):
    description: str = Field(min_length=1, max_length=500)
    may: list[Action] = Field(description="Actions this role may take.")
    may_write_kinds: list[str] = Field(default_factory=list, description="Artifact kinds this role may draft.")


class Constitution(Strict):
    title: str = Field(min_length=1, max_length=200)
    separate_author_and_reviewer: bool = Field(
        False, description="When true, nobody accepts an artifact they wrote (owners' direct supersede stays, audited).")
    admission: Literal["owner_accepts"] = "owner_accepts"
    roles: dict[str, RolePolicy] = Field(min_length=1)

    @field_validator("roles")
    @classmethod
    def _role_names(cls, v: dict[str, RolePolicy]) -> dict[str, RolePolicy]:
        for name in v:
            if not ROLE_NAME.fullmatch(name):
                raise ValueError(f"role name {name!r} must match {ROLE_NAME.pattern}")
        return v


class RegistryEntry(Strict):
    principal: str = Field(pattern=f"^{PRINCIPAL.pattern}$", description="The agent's authenticated principal (its token's sub).")
    role: str = Field(pattern=f"^{ROLE_NAME.pattern}$", description="One of the constitution's roles.")
    status: AgentStatus = "active"
    proposed_by: str
    proposed_at: str = Field(description="RFC 3339")
    takes_over_from: str | None = Field(None, description="A predecessor whose sources this agent also restores from.")
    note: str = ""


class AgentRegistry(Strict):
    agents: list[RegistryEntry] = Field(default_factory=list)

    @field_validator("agents")
    @classmethod
    def _unique(cls, v: list[RegistryEntry]) -> list[RegistryEntry]:
        names = [a.principal for a in v]
        if len(names) != len(set(names)):
            raise ValueError("each principal appears once in the registry")
        return v

    def find(self, principal: str) -> RegistryEntry | None:
        return next((a for a in self.agents if a.principal == principal), None)

    def paths_holder(self, principal: str) -> str | None:
        """Another registered agent whose working paths `principal` would write to (one path segment)."""
        segment = principal_segment(principal)
        return next((a.principal for a in self.agents if a.principal != principal and principal_segment(a.principal) == segment),
                    None)


PLACEHOLDER = "{principal}"


def principal_segment(principal: str) -> str:
    """The agent's principal as a path segment: a token's sub may hold capitals, '@' or ':'
    (alice@example.com), which an artifact path does not."""
    return re.sub(r"[^a-z0-9._-]", "-", principal.lower()).lstrip("._-")[:64] or "agent"


def fill_path(template: str, principal: str) -> str:
    return template.replace(PLACEHOLDER, principal_segment(principal))


class Charter(Strict):
    role: str = Field(pattern=f"^{ROLE_NAME.pattern}$")
    purpose: str = Field(min_length=1, max_length=1000)
    duties: list[str] = Field(min_length=1)
    must_read: list[str] = Field(description="Artifact paths the agent reads at start.")
    sources: list[str] = Field(description="Paths ({principal} = the agent) its working state is restored from.")
    handoff_path: str = Field(description="Where it leaves its handoff ({principal} = the agent).")

    @field_validator("must_read", "sources")
    @classmethod
    def _paths(cls, v: list[str]) -> list[str]:
        for template in v:
            cls._path(template)
        return v

    @field_validator("handoff_path")
    @classmethod
    def _path(cls, v: str) -> str:
        # Checked here, not when an agent is listed: a template such as agents/{name}/worklog
        # once broke list_population_agents for the whole realm.
        if not ARTIFACT_PATH.fullmatch(fill_path(v, "agent")):
            raise ValueError(f"{v!r} is not an artifact path (lowercase segments of [a-z0-9._-]; "
                             f"{PLACEHOLDER} is the only placeholder)")
        return v


def agent_refusals(constitution: Constitution, registry: AgentRegistry, principal: str, action: str,
                   artifact_kind: str | None = None) -> list[str]:
    """Why the constitution would refuse this registered agent this action (empty: allowed)."""
    entry = registry.find(principal)
    if entry is None:
        return [f"{principal} is not in the agent registry (an owner accepts an admission first)"]
    if entry.status != "active":
        return [f"{principal} is {entry.status} in the registry"]
    policy = constitution.roles.get(entry.role)
    if policy is None:
        return [f"role {entry.role!r} is not in the constitution"]
    out = []
    if action not in policy.may:
        out.append(f"role {entry.role} may {sorted(policy.may)}, not {action}")
    if action == "create_draft" and artifact_kind is not None and artifact_kind not in policy.may_write_kinds:
        out.append(f"role {entry.role} may write {sorted(policy.may_write_kinds)}, not {artifact_kind}")
    return out


SCHEMAS: dict[str, type[Strict]] = {"constitution": Constitution, "agent_registry": AgentRegistry, "charter": Charter}


def parse_body(kind: str, body: str) -> Strict | None:
    """The typed body of a structured kind (None for free-text kinds); a bad body names its field."""
    model = SCHEMAS.get(kind)
    if model is None:
        return None
    try:
        return model.model_validate(json.loads(body))
    except json.JSONDecodeError as exc:
        raise RuleBroken("body", f"the body of an artifact of kind {kind} must be JSON ({exc.msg} at line {exc.lineno})") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or kind
        raise RuleBroken("body", f"{kind} body: {where}: {first['msg']}") from None
    except (RecursionError, ValueError):  # nested past Python's stack, or an integer of over 4,300 digits
        raise RuleBroken("body", f"the body of an artifact of kind {kind} is JSON nested too deep or holding "
                                 "an integer too long to read") from None


def parse_stored_body(kind: str, body: str) -> Strict | None:
    """The typed body of a stored artifact (an accepted constitution, registry or charter): one
    that no longer validates (a hand edit, a restore from another version) is damaged data, the
    server's fault, not a refusal of whoever happened to call."""
    try:
        return parse_body(kind, body)
    except RuleBroken:
        raise DamagedRow(f"a stored {kind} body fails validation") from None


_AWARE_TIME = TypeAdapter(AwareDatetime)


def _is_rfc3339(text: str) -> bool:
    try:
        _AWARE_TIME.validate_python(text)
    except ValidationError:
        return False
    return "T" in text.upper()


def check_new_body(body: Strict | None, constitution: Constitution | None, registry: AgentRegistry | None) -> None:
    """What a new version of a population document meets beyond its schema, given the realm's
    accepted constitution and registry. Only what the version adds or changes is held to it: a
    version accepted before a rule existed stays readable, and an owner can still suspend or
    retire an agent admitted before it."""
    if isinstance(body, Constitution):
        accepted = constitution.roles if constitution else {}
        for name, policy in body.roles.items():
            known = set(accepted[name].may_write_kinds) if name in accepted else set()
            unknown = sorted(set(policy.may_write_kinds) - set(WRITE_MODE) - known)
            if unknown:
                raise RuleBroken("body", f"constitution body: roles.{name}.may_write_kinds: unknown kinds {unknown}; "
                                 f"each one of {sorted(WRITE_MODE)}")
    if isinstance(body, Charter) and constitution is not None and body.role not in constitution.roles:
        raise RuleBroken("body", f"charter body: role {body.role!r} is not one of the constitution's roles "
                         f"{sorted(constitution.roles)}")
    if isinstance(body, Constitution) and constitution is not None and registry is not None:
        check_roles_kept(body, constitution, registry)
    if isinstance(body, AgentRegistry):
        before = {a.principal: a for a in registry.agents} if registry else {}
        check_agents_kept(body, before)
        holders = {principal_segment(p): p for p in before}
        for a in body.agents:
            was = before.get(a.principal)
            where = f"agent_registry body: agent {a.principal!r}"
            if (was is None or was.proposed_at != a.proposed_at) and not _is_rfc3339(a.proposed_at):
                raise RuleBroken("body", f"{where}: proposed_at {a.proposed_at!r} is not an RFC 3339 time with an offset")
            if (was is None or was.role != a.role) and constitution is not None and a.role not in constitution.roles:
                raise RuleBroken("body", f"{where}: role {a.role!r} is not one of the constitution's roles "
                                 f"{sorted(constitution.roles)}")
            if was is None:  # two agents would restore each other's worklog and handoff
                segment = principal_segment(a.principal)
                other = holders.setdefault(segment, a.principal)
                if other != a.principal:
                    raise RuleBroken("body", f"{where}: its working paths ({PLACEHOLDER} = {segment!r}) are those of "
                                     f"{other!r}; admit it under another principal")


def check_agents_kept(body: AgentRegistry, before: dict[str, RegistryEntry]) -> None:
    """An agent leaves the registry by its status, never by losing its entry: a principal outside
    the registry is a person, governed by its token's realm role alone, so dropping a misbehaving
    agent's entry gave it rights its role never had."""
    kept = {a.principal for a in body.agents}
    dropped = [p for p in before if p not in kept]
    if dropped:
        raise RuleBroken("body", f"agent_registry body: agent {shown(dropped[0])} is in the accepted registry and missing "
                         f"here{f' (and {len(dropped) - 1} more)' if len(dropped) > 1 else ''}; an agent is never removed "
                         "(unlisted, the constitution would no longer bind it): set its status to 'suspended' or 'retired'")


def check_roles_kept(body: Constitution, constitution: Constitution, registry: AgentRegistry) -> None:
    """A role the accepted constitution has and a registered agent (not retired) holds stays:
    without it that agent would be refused everything with nothing to say why it was admitted."""
    dropped = set(constitution.roles) - set(body.roles)
    holders = [a for a in registry.agents if a.role in dropped and a.status != "retired"]
    if holders:
        names = ", ".join(f"{shown(a.principal)} ({a.role}, {a.status})" for a in holders[:5])
        more = f" and {len(holders) - 5} more" if len(holders) > 5 else ""
        raise RuleBroken("body", f"constitution body: roles: {sorted({a.role for a in holders})} are held by registered "
                         f"agents {names}{more}; retire them or give them another role in population/registry first")


def check_place(path: str, body: Strict | None) -> None:
    """A charter says which role it is for, and lives at that role's path."""
    if isinstance(body, Charter) and path != CHARTER_PREFIX + body.role:
        raise RuleBroken("artifact_path", f"the charter of role {body.role!r} lives at {CHARTER_PREFIX + body.role!r}")


def check_path(kind: str, path: str) -> None:
    """Each structured kind lives at its own place, so an agent finds it without searching."""
    expected = {"constitution": CONSTITUTION_PATH, "agent_registry": REGISTRY_PATH}.get(kind)
    if expected and path != expected:
        raise RuleBroken("artifact_path", f"a {kind} lives at {expected!r}")
    if kind == "charter" and not path.startswith(CHARTER_PREFIX):
        raise RuleBroken("artifact_path", f"a charter lives under {CHARTER_PREFIX!r}<role>")
    if kind not in SCHEMAS and path.startswith("population/"):
        raise RuleBroken("artifact_path", "population/ holds only the constitution, the registry and charters")


def dump(model: BaseModel) -> str:
    return json.dumps(model.model_dump(mode="json"), indent=2, ensure_ascii=False)
