"""Positions in the loader's order and epochs' ends: a State checked (check_state,
state_of), the state at an epoch's start (epoch_start), and what an end message says
of its epoch (epoch_end, estimated_epoch_warning)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, cast

from .errors import ProtocolError, ShardloadWarning
from .messages import EndMessage, EpochEnd, State

# The members of a state and their types.
_STATE_MEMBERS: Tuple[Tuple[str, type], ...] = (
    ("epoch", int), ("order", str), ("samples", int), ("runs", str), ("batches", int))


def check_state(state: Mapping[str, Any]) -> State:
    """A copy of state, a position that Client.state_dict() returned, as a plain dict
    of its five members: epoch, order, samples, runs, batches (ints and strings), and
    rows, a packed epoch's position, when it has it.
    Raises ValueError for anything else (a checkpoint's other members are not copied)."""
    if not hasattr(state, "keys") or not hasattr(state, "__getitem__"):
        raise ValueError(f"a shardload state is a dict such as Client.state_dict() returns, not {type(state).__name__}")
    out: Dict[str, Any] = {}
    for name, kind in _STATE_MEMBERS:
        if name not in state:
            raise ValueError(f"a shardload state has the members {', '.join(n for n, _ in _STATE_MEMBERS)}; "
                             f"this one has no {name!r} (members: {', '.join(map(str, state.keys()))})")
        v = state[name]
        if kind is int:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise ValueError(f"shardload state: {name} {v!r} is not an int")
            v = int(v.__index__())
        elif not isinstance(v, str):
            raise ValueError(f"shardload state: {name} {v!r} is not a string")
        out[name] = v
    if out["epoch"] < 0:
        raise ValueError(f"shardload state: epoch {out['epoch']} < 0")
    if "rows" in state:  # a packed epoch's position
        v = state["rows"]
        if isinstance(v, bool) or not hasattr(v, "__index__") or int(v.__index__()) < 0:
            raise ValueError(f"shardload state: rows {v!r} is not a non-negative int")
        out["rows"] = int(v.__index__())
    return cast(State, out)


def state_of(msg: Mapping[str, Any], what: str) -> Optional[State]:
    """The state a server message carries, None when it carries none."""
    st = msg.get("state")
    if st is None:
        return None
    try:
        return check_state(st)
    except ValueError as e:
        raise ProtocolError(f"the server's {what} carries a state this client cannot read: {e}") from None


def epoch_start(epoch: int, state: Optional[State]) -> State:
    """The state at the start of epoch, under the order of state (a state of any epoch
    of the same dataset and settings; None when unknown)."""
    order, samples = ("", 0) if state is None else (state["order"], state["samples"])
    return {"epoch": epoch, "order": order, "samples": samples, "runs": "", "batches": 0}


def epoch_end(msg: EndMessage) -> EpochEnd:
    """What an end message says of its epoch, members left out read as zero."""
    return {
        "epoch": int(msg.get("epoch", 0)), "batches": int(msg.get("batches", 0)),
        "samples": int(msg.get("samples", 0)), "padded": int(msg.get("padded", 0)),
        "left_out": int(msg.get("trimmed", 0)), "skipped": int(msg.get("skipped", 0)),
        "estimated": bool(msg.get("estimated", False)), "abandoned": bool(msg.get("abandoned", False)),
        "streams": [{"samples": int(s.get("samples", 0)), "bytes": int(s.get("bytes", 0)),
                     "skipped": int(s.get("skipped", 0))} for s in msg.get("streams") or []],
    }


def estimated_epoch_warning(e: EpochEnd, rank: int) -> Optional[ShardloadWarning]:
    """The warning for an epoch planned from estimated counts that left samples out or
    repeated some (None for any other epoch)."""
    if not e["estimated"] or e["abandoned"] or not (e["padded"] or e["left_out"]):
        return None
    return ShardloadWarning(
        f"shardload: epoch {e['epoch']} of rank {rank} was planned from sample counts estimated "
        f"from the shards' sizes (no index): {e['left_out']} samples were left out and {e['padded']} "
        f"rows repeat other samples; for exact epochs write an index once (shardload index --output "
        f"DIR/ URL...) or pass count_first=True")
