"""The order check: every rank of a job must read the same order (see Client's
``check_order``). Against $SHARDLOAD_EXPECT_ORDER, and across the ranks of an
initialised torch.distributed world through its store (or all_gather_object without
one)."""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .errors import OrderMismatch, ShardloadError, Timeout

# Counts the Clients this process created with the order check on: the store keys of
# one check are the same on every rank when every rank creates its clients alike.
_order_checks = itertools.count()


def _torch_distributed() -> Any:
    """torch.distributed when a world of more than one rank is initialised (torch
    already imported), else None."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() <= 1:
        return None
    return dist


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _job(order: Mapping[str, Any]) -> Any:
    """The digest of every setting of an order, which the ranks of a job compare: the
    server's "job" (protocol 4; its "fingerprint" names the order of the samples alone),
    else its "fingerprint"."""
    return order.get("job") or order.get("fingerprint")


# Where a trainer sets each setting of an order: the Client (and ShardloadDataset)
# keyword, and the server's flag that is the default when the keyword is not given
# ("": the trainer's alone).
_SETTING_SOURCES: Dict[str, Tuple[str, str]] = {
    "seed": ("seed=", ""),
    "batch_size": ("batch_size=", ""),
    "drop_last": ("drop_last=", ""),
    "epoch": ("epoch= or set_epoch()", ""),
    "world": ("world= or $WORLD_SIZE", ""),
    "shuffle": ("shuffle=", "--no-shuffle"),
    "lanes": ("open_shards=", "--open-shards"),
    "window": ("shuffle_buffer= or shuffle_bytes=", "--shuffle-buffer or --shuffle-bytes"),
    "dataset": ("urls=", "its URLs"),
    "shards": ("urls=", "its URLs"),
    "samples": ("urls=", "its URLs and index"),
}


def _where_set(name: str) -> str:
    """How a trainer makes setting name the same on every rank."""
    if name == "seed":
        return ("seed must be the same on every rank: pass the same seed= to every rank's Client "
                "or ShardloadDataset, e.g. not seed=rank (the ranks take disjoint parts of the one "
                "order the seed decides)")
    keyword, flag = _SETTING_SOURCES.get(name, ("", ""))
    if not keyword:
        return f"{name} must be the same on every rank (every rank's server must run with the same settings)"
    where = f"{keyword} of every rank's Client or ShardloadDataset"
    if flag:
        where += f", else the server's {flag}"
    return f"{name} must be the same on every rank: {where}"


def _order_difference(rank: int, mine: Dict[str, Any], other_rank: int, other: Dict[str, Any]) -> str:
    """The message for two ranks whose orders differ; rank is the one that is not 0. It
    names the settings the ranks disagree on and how a trainer makes each the same."""
    s, o = mine.get("settings") or {}, other.get("settings") or {}
    names = [k for k in list(o) + [k for k in s if k not in o] if s.get(k) != o.get(k)]
    if not names:
        return (f"rank {rank}'s shardload server reads another order than rank {other_rank}'s: job "
                f"fingerprint {_job(mine)} (rank {rank}) vs {_job(other)} (rank {other_rank}) with the "
                "same settings (are the servers of different versions?)")
    diffs = [f"{k} {_show(s.get(k))} (rank {rank}) vs {_show(o.get(k))} (rank {other_rank})" for k in names]
    return (f"rank {rank} and rank {other_rank} would read different shardload orders: the ranks disagree "
            f"on {', '.join(diffs)}. " + "; ".join(_where_set(k) for k in names))


def _store_has(store: Any, key: str) -> bool:
    check = getattr(store, "check", None)  # not in every torch version's stores
    if check is not None:
        return bool(check([key]))
    from datetime import timedelta
    try:
        store.wait([key], timedelta(milliseconds=10))
        return True
    except Exception:
        return False


def _order_verdict(orders: List[Dict[str, Any]], rank: int) -> str:
    """What rank reports of every rank's order: its own difference from rank 0's, else
    the first rank's that differs ("" when all agree)."""
    zero = orders[0]
    if rank != 0 and _job(orders[rank]) != _job(zero):
        return _order_difference(rank, orders[rank], 0, zero)
    for r in range(1, len(orders)):
        if _job(orders[r]) != _job(zero):
            return _order_difference(r, orders[r], 0, zero)
    return ""


def check_order(order: Optional[Mapping[str, Any]], server: str, timeout: float) -> None:
    """Raise OrderMismatch when the order of the server at the socket path server
    (the ready's) is not $SHARDLOAD_EXPECT_ORDER's, or differs from another rank's;
    Timeout when a rank does not report within timeout seconds."""
    k = next(_order_checks)
    order = order if isinstance(order, dict) else {}
    fp = order.get("fingerprint")
    want = os.environ.get("SHARDLOAD_EXPECT_ORDER")
    if want and fp != want:
        raise OrderMismatch(
            f"the shardload server at {server} reads order {fp} but SHARDLOAD_EXPECT_ORDER "
            f"is {want}: its settings are {json.dumps(order.get('settings'))}")
    dist = _torch_distributed()
    if dist is None:
        return
    mine = {"fingerprint": fp, "job": order.get("job"), "settings": order.get("settings")}
    try:
        msg = _compare_orders(dist, k, mine, timeout)
    except ShardloadError:
        raise
    except Exception as e:  # the store's errors differ between torch versions
        raise ShardloadError(f"comparing the ranks' shardload orders through torch.distributed: {e}") from None
    if msg:
        raise OrderMismatch(msg)


def _compare_orders(dist: Any, k: int, mine: Dict[str, Any], timeout: float) -> str:
    """The mismatch this rank reports ("" for none). Every rank puts its order in the
    default store; rank 0 compares them all and puts its verdict there; the other
    ranks read rank 0's order and the verdict, so that every rank fails when any
    differs."""
    from datetime import timedelta
    rank, world = dist.get_rank(), dist.get_world_size()
    wait = timedelta(seconds=timeout)
    try:
        from torch.distributed import distributed_c10d as c10d
        store = c10d._get_default_store()  # type: ignore[no-untyped-call]
    except (ImportError, AttributeError):
        store = None
    if store is None:
        # No default store: every rank gathers every rank's order (gloo).
        group = dist.new_group(backend="gloo", timeout=wait)
        orders: List[Any] = [None] * world
        try:
            dist.all_gather_object(orders, mine, group=group)
        except RuntimeError as e:
            raise Timeout(f"gathering the ranks' shardload orders within {timeout}s (check_timeout) "
                          f"failed: {e}") from None
        return _order_verdict(orders, rank)
    key = f"shardload/order/{k}/"
    store.set(key + str(rank), json.dumps(mine))
    if rank == 0:
        keys = [key + str(r) for r in range(world)]
        try:
            store.wait(keys, wait)
        except Exception:  # the store's timeout error type differs between torch versions
            missing = [str(r) for r in range(world) if not _store_has(store, key + str(r))]
            text = (f"rank(s) {', '.join(missing)} did not report their shardload order within "
                    f"{timeout}s (check_timeout): did every rank create its shardload client, "
                    "with the order check on?")
            store.set(key + "verdict", json.dumps({"timeout": text}))
            raise Timeout(text) from None
        verdict = _order_verdict([json.loads(store.get(x)) for x in keys], 0)
        store.set(key + "verdict", json.dumps({"mismatch": verdict}))
        # The store lives in this process: keep it until every rank has read.
        try:
            store.wait([key + f"seen/{r}" for r in range(1, world)], wait)
        except Exception:
            pass
        return verdict
    try:
        store.wait([key + "0", key + "verdict"], wait)
    except Exception:
        raise Timeout(f"rank 0 did not compare the ranks' shardload orders within {timeout}s "
                      "(check_timeout): did it create its shardload client, with the order check on?") from None
    zero: Dict[str, Any] = json.loads(store.get(key + "0"))
    told: Dict[str, str] = json.loads(store.get(key + "verdict"))
    store.set(key + f"seen/{rank}", "1")
    if "timeout" in told:
        raise Timeout(told["timeout"])
    if _job(zero) != _job(mine):
        return _order_difference(rank, mine, 0, zero)
    return told.get("mismatch", "")
