"""Redis keys the indexers coordinate through (besides the stream and its group)."""

from shared import index_requests

DUE = index_requests.DUE  # zset: user_hash -> time its next index run may start (recall asks for runs too)
# set of user hashes whose memory carries another model's stamp: added by a start sweep, removed
# by the tenant's next finished index run (which re-embeds first) or its forget
REEMBED_PENDING = "recall:reembed:pending"


def dirty(uhash: str) -> str:
    """Counter bumped on every snapshot write; a run that saw it change must run again."""
    return f"recall:index:dirty:{uhash}"


def received(uhash: str) -> str:
    """List of ingest times of snapshots not yet indexed (for ingest-to-searchable)."""
    return f"recall:index:received:{uhash}"


def pending_bytes(uhash: str) -> str:
    """How many bytes the user's transcript files grew by since its last finished index run: the
    scheduler's estimate of the next run's work, read before the run starts (a heavy run)."""
    return f"recall:index:pending-bytes:{uhash}"


def index_lock(uhash: str) -> str:
    return f"recall:lock:index:{uhash}"


def forget_waiting(uhash: str) -> str:
    """Exists while a forget of the user waits for its index lock (a set of the waiting forgets'
    tokens; before, a count under another name): a running index run yields it."""
    return f"recall:forget-waiters:{uhash}"


def conversation_lock(uhash: str, conversation_id: str) -> str:
    return f"recall:lock:conv:{uhash}:{conversation_id}"
