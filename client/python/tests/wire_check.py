"""Checks the Python client against the golden fixtures of the wire format that the Go
tests write (wire/golden_test.go; go test ./wire -update rewrites them):

    wire_check.py DIR        DIR: wire/testdata

- messages.json (one of each message, every member set): every message has the
  members of its TypedDict in shardload.protocol, each of the declared type, and
  every required one; the client's own messages (the hello built by
  protocol.hello_message from Client's keyword arguments, release, epoch) have the
  fixture's member names.
- slab.bin and slab.json (a collated batch's slab, its batch message and the values
  of its rows): the batch decoded through the client's own column views
  (shardload.batch.batch_views, over the slab's bytes instead of a mapping) reads the
  fixture's values, with numpy, with torch when it imports, and with the standard
  library alone (in a child process that cannot import numpy or torch); and every view
  holds an export of the batch's memoryview (shardload.slabs' ownership rule).

Prints one JSON line, {"messages": 7, "columns": 7, "rows": 5, ...}, and exits 0; on a
mismatch prints what differs and exits 1.
"""

import json
import os
import subprocess
import sys
import typing

STDLIB_ONLY = "--stdlib-only"
if STDLIB_ONLY in sys.argv:  # the child: numpy and torch cannot be imported
    sys.modules["numpy"] = None
    sys.modules["torch"] = None

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardload import batch as sbatch  # noqa: E402
from shardload import messages, protocol  # noqa: E402

problems = []
# Without typing.NotRequired (Python 3.11) nor typing_extensions, the TypedDicts'
# __required_keys__ name every member (see shardload.messages): not checked then.
EXACT_REQUIRED = not hasattr(messages, "_NotRequired")
HAVE_TORCH = False  # torch imports (main sets it)


def problem(text):
    problems.append(text)


# -- messages --

def is_typeddict(tp):
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def check_value(v, tp, where):
    """Whether v, read from JSON, is of type tp (as the TypedDicts declare members)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return
    if is_typeddict(tp):
        check_message(v, tp, where)
    elif origin is typing.Literal:
        if v not in args:
            problem(f"{where}: {v!r}, want one of {args}")
    elif origin is list:
        if not isinstance(v, list):
            problem(f"{where}: {v!r} is not a list")
        else:
            for i, x in enumerate(v):
                check_value(x, args[0], f"{where}[{i}]")
    elif origin is dict:
        if not isinstance(v, dict):
            problem(f"{where}: {v!r} is not an object")
        else:
            for k, x in v.items():
                check_value(x, args[1], f"{where}.{k}")
    elif origin is typing.Union:
        if not any(not _mismatch(v, a) for a in args):
            problem(f"{where}: {v!r} is none of {args}")
    elif tp is bool:
        if type(v) is not bool:
            problem(f"{where}: {v!r} is not a bool")
    elif tp is int:
        if type(v) is not int:
            problem(f"{where}: {v!r} is not an int")
    elif tp is float:
        if type(v) not in (int, float):  # a JSON number
            problem(f"{where}: {v!r} is not a number")
    elif tp is str:
        if type(v) is not str:
            problem(f"{where}: {v!r} is not a string")
    else:
        problem(f"{where}: a member of type {tp!r}, which this check does not know")


def _mismatch(v, tp):
    n = len(problems)
    check_value(v, tp, "")
    bad = len(problems) > n
    del problems[n:]
    return bad


def check_message(msg, td, where):
    """msg has only members td declares, each of its type, and all td requires."""
    if not isinstance(msg, dict):
        problem(f"{where}: {msg!r} is not an object")
        return
    hints = typing.get_type_hints(td)
    for k, v in msg.items():
        if k not in hints:
            problem(f"{where}: member {k!r} is not declared by {td.__name__}")
        else:
            check_value(v, hints[k], f"{where}.{k}")
    for k in sorted(td.__required_keys__) if EXACT_REQUIRED else ():
        if k not in msg:
            problem(f"{where}: required member {k!r} of {td.__name__} missing")


def check_messages(d):
    with open(os.path.join(d, "messages.json")) as f:
        fixture = json.load(f)
    for name, msg in sorted(fixture.items()):
        td = protocol.MESSAGES.get(name)
        if td is None:
            problem(f"messages.json: message {name!r} has no TypedDict in shardload.protocol.MESSAGES")
            continue
        if msg.get("type") != name:
            problem(f"messages.json: {name} has type {msg.get('type')!r}")
        check_message(msg, td, name)
        # Every member the TypedDict declares is in the fixture (it sets them all).
        for k in typing.get_type_hints(td):
            if k not in msg:
                problem(f"{name}: {td.__name__} declares {k!r}, which the fixture (every member set) lacks")

    # The client's hello: hello_message with every one of Client's settings.
    want = fixture["hello"]
    kw = {k: want[k] for k in ("rank", "world", "local_rank", "seed", "epoch", "batch_size", "drop_last",
                               "fields", "urls", "image_layout", "state", "gpu_pci", "cuda_visible_devices")}
    kw.update({k: want[k] for k in protocol.SETTINGS})
    kw["count_first"] = True  # a false one is left out (the server reads it as false)
    kw["epoch_samples"], kw["batching"] = want["epoch_samples"], want["batching"]
    kw["pack"], kw["epoch_tokens"] = want["pack"], want["epoch_tokens"]
    got = protocol.hello_message(**kw)
    check_message(got, protocol.HelloMessage, "hello_message")
    # The fixture sets urls and streams; a client sends one or the other.
    if sorted(got) != sorted(set(want) - {"streams"}):
        problem(f"hello_message's members {sorted(got)}, the fixture's {sorted(want)} less streams")
    mixed = protocol.hello_message(**dict(kw, urls=None, streams=want["streams"]))
    check_message(mixed, protocol.HelloMessage, "hello_message with streams")
    if mixed.get("streams") != want["streams"] or "urls" in mixed:
        problem(f"hello_message's streams {mixed.get('streams')!r} (urls {mixed.get('urls')!r}), the fixture's {want['streams']!r}")
    for k in want:
        if k in got and k != "count_first" and got[k] != want[k]:
            problem(f"hello_message's {k} {got[k]!r}, the fixture's {want[k]!r}")
    kw["count_first"] = kw["allow_estimate"] = False
    left = protocol.hello_message(**kw)
    if "count_first" in left or "allow_estimate" in left:
        problem("hello_message sends a false count_first or allow_estimate")
    for name, got in (("release", protocol.release_message(1, 5, 2, 1.25)),
                      ("epoch", protocol.epoch_message(3, fixture["epoch"]["state"])),
                      ("bye", protocol.BYE)):
        check_message(got, protocol.MESSAGES[name], f"{name} as the client writes it")
        if name in fixture and got != fixture[name]:
            problem(f"{name} as the client writes it: {got}, the fixture's {fixture[name]}")
    return len(fixture)


# -- the slab --

def row_bytes(row):
    if isinstance(row, memoryview):
        return bytes(row)
    if hasattr(row, "numpy"):
        return row.numpy().tobytes()  # a torch tensor
    return row.tobytes()


def load_slab(d):
    with open(os.path.join(d, "slab.json")) as f:
        fx = json.load(f)
    with open(os.path.join(d, "slab.bin"), "rb") as f:
        data = f.read()
    return fx, data


def modules(mode):
    np = torch = None
    if mode != "memoryview":
        import numpy as np
    if mode == "torch":
        import torch
    return np, torch


def batch_of(fx, data, mode):
    """The batch in the slab, decoded as the client decodes one (mode: its output),
    and the batch's own memoryview of the slab's bytes (as Slabs.lend makes it over a
    mapping)."""
    np, torch = modules(mode)
    msg = fx["batch"]
    buf = memoryview(bytearray(data))[0:len(data)].toreadonly()
    cols, keys = sbatch.batch_views(buf, msg["columns"], msg["rows"], np, torch)
    return sbatch.Batch(None, msg, cols, keys, protocol.state_of(msg, "batch")), buf


def decode_slab(d, mode):
    """Decode slab.bin as the client does in mode (numpy, torch or memoryview) and
    compare with slab.json's values. Returns (columns, rows)."""
    fx, data = load_slab(d)
    msg, values = fx["batch"], fx["values"]
    check_message(msg, protocol.BatchMessage, "slab.json batch")
    for i, field in enumerate(fx["fields"]):
        check_message(field, protocol.FieldInfo, f"slab.json fields[{i}]")
    _, torch = modules(mode)
    b, buf = batch_of(fx, data, mode)
    kinds = {c["name"]: c for c in msg["columns"]}
    where = f"slab ({mode})"
    if sorted(list(b) + ["__key__"]) != sorted(values):
        problem(f"{where}: columns {sorted(b)} + __key__, the fixture's {sorted(values)}")
    for name, want in values.items():
        if name == "__key__":
            got = b.keys
        elif name not in b:
            continue
        else:
            col, info = b[name], kinds[name]
            if info["ragged"]:
                if not isinstance(col, sbatch.Ragged):
                    problem(f"{where}: {name} is a {type(col).__name__}, want a Ragged")
                    continue
                got = [row_bytes(r).hex() for r in col]
                text = info["kind"] in ("text", "json")
                if col.tolist() != [bytes.fromhex(h).decode() if text else bytes.fromhex(h) for h in want]:
                    problem(f"{where}: {name}.tolist() {col.tolist()}")
            else:
                got = col.tolist()
                if list(getattr(col, "shape", ())) != info["shape"]:
                    problem(f"{where}: {name} of shape {tuple(col.shape)}, want {info['shape']}")
                if mode == "torch" and not isinstance(col, torch.Tensor):
                    problem(f"{where}: {name} is a {type(col).__name__}, want a torch tensor")
                if mode == "numpy" and col.dtype.str != info["dtype"]:
                    problem(f"{where}: {name} of dtype {col.dtype.str}, want {info['dtype']}")
            del col
        if got != want:
            problem(f"{where}: {name} reads {got}, the fixture's {want}")
    n_cols, n_rows = len(list(b)) + 1, b.rows
    if not held(buf):
        problem(f"{where}: the batch's memoryview was released while the batch held its columns")
    check_ownership(fx, data, mode)
    return n_cols, n_rows


def held(buf):
    """Whether a view of buf is alive: buf.release() fails. (When it succeeds, buf is
    released.)"""
    try:
        buf.release()
    except BufferError:
        return True
    return False


def check_ownership(fx, data, mode):
    """Every kind of view the client hands out holds an export of the batch's
    memoryview, alone, after the batch dropped its columns as a release does; and
    nothing holds one once the views are gone."""
    cols = fx["batch"]["columns"]
    ragged = next(c["name"] for c in cols if c["ragged"] and c["name"] != "__key__")
    fixed = [c["name"] for c in cols if not c["ragged"]]
    takes = [("the keys, unread", None)]
    takes += [(f"column {n}", lambda b, n=n: b[n]) for n in fixed]
    takes += [("a Ragged", lambda b: b[ragged]), ("a Ragged row", lambda b: b[ragged][1]),
              ("a Ragged's data", lambda b: b[ragged].data), ("a Ragged's offsets", lambda b: b[ragged].offsets),
              ("the columns", lambda b: b.columns), ("to_dict()", lambda b: b.to_dict())]
    if HAVE_TORCH:  # to_torch() of every output
        takes += [("a to_torch() tensor", lambda b: b.to_torch()[fixed[0]]),
                  ("a to_torch() Ragged row", lambda b: b.to_torch()[ragged][2])]
    for what, take in takes:
        b, buf = batch_of(fx, data, mode)
        view = take(b) if take is not None else None
        b._drop()  # as a release does: the keys copied out, the columns dropped
        if view is not None and not held(buf):
            problem(f"ownership ({mode}): {what} holds no export of the batch's memoryview")
            continue
        del view
        if held(buf):
            problem(f"ownership ({mode}): with {what} gone, the batch's memoryview is still exported")
        copied = batch_of(fx, data, mode)
        owned = copied[0].copy()
        copied[0]._drop()
        if held(copied[1]):
            problem(f"ownership ({mode}): a copy() holds an export of the batch's memoryview")
        del owned


def main():
    args = [a for a in sys.argv[1:] if a != STDLIB_ONLY]
    if len(args) != 1:
        sys.exit("usage: wire_check.py DIR (wire/testdata)")
    d = args[0]
    if STDLIB_ONLY in sys.argv:
        cols, rows = decode_slab(d, "memoryview")
        print(json.dumps({"columns": cols, "rows": rows, "problems": problems, "required_checked": EXACT_REQUIRED}))
        return
    global HAVE_TORCH
    try:
        import torch  # noqa: F401
        HAVE_TORCH = True
    except ImportError:
        pass
    n = check_messages(d)
    modes = ["numpy"] + (["torch"] if HAVE_TORCH else []) + ["memoryview"]  # memoryview: output="memoryview"
    for mode in modes:
        cols, rows = decode_slab(d, mode)
    child = subprocess.run([sys.executable, os.path.abspath(__file__), d, STDLIB_ONLY], capture_output=True,
                           text=True)
    try:
        got = json.loads(child.stdout.strip().splitlines()[-1])
        problems.extend(f"without numpy: {p}" for p in got["problems"])
        if (got["columns"], got["rows"]) != (cols, rows):
            problem(f"without numpy: {got['columns']} columns of {got['rows']} rows")
        modes.append("stdlib")
    except (IndexError, ValueError, KeyError):
        problem(f"without numpy: the check failed: {child.stdout}{child.stderr}")
    if problems:
        for p in problems:
            print(p)
        sys.exit(1)
    out = {"messages": n, "columns": cols, "rows": rows, "modes": modes}
    if not EXACT_REQUIRED:
        out["required_members"] = "not checked: this Python has neither typing.NotRequired nor typing_extensions"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
