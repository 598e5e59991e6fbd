"""Checks that the settings a trainer's hello may carry are the same in the Python
client and in the server: shardload.hello.SETTINGS, the client's one table of them,
against the names the Go side gives (shardload.Knobs: each Knob's Hello), and that the
table is what the client uses (hello_message's and Client's keyword arguments,
HelloMessage's members, the members hello_message sends).

    settings_check.py NAME...    NAME: every Hello of shardload.Knobs

integration's TestPythonSettingsAreTheKnobs runs it. Prints one JSON line,
{"settings": 9}, and exits 0; on a mismatch prints what differs and exits 1.
"""

import inspect
import json
import os
import sys
import typing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shardload import Client  # noqa: E402
from shardload import hello  # noqa: E402
from shardload.messages import HelloMessage  # noqa: E402


def main(go_names):
    problems = []
    mine = list(hello.SETTINGS)
    if len(set(mine)) != len(mine):
        problems.append(f"shardload.hello.SETTINGS names a setting twice: {mine}")
    if not go_names:
        problems.append("no names given (want every Hello of shardload.Knobs)")
    for name in sorted(set(go_names) - set(mine)):
        problems.append(f"{name!r} is a Hello of shardload.Knobs but not in shardload.hello.SETTINGS")
    for name in sorted(set(mine) - set(go_names)):
        problems.append(f"{name!r} is in shardload.hello.SETTINGS but no Hello of shardload.Knobs")

    # The table is what the client uses.
    members = typing.get_type_hints(HelloMessage)
    for where, fn in (("hello_message", hello.hello_message), ("Client", Client.__init__)):
        params = inspect.signature(fn).parameters
        for name in mine:
            p = params.get(name)
            if p is None or p.kind is not inspect.Parameter.KEYWORD_ONLY:
                problems.append(f"{where} has no keyword argument {name!r}")
    for name in mine:
        if name not in members:
            problems.append(f"HelloMessage has no member {name!r}")
    given = {name: True if members.get(name) is bool else 1 for name in mine}
    sent = hello.hello_message(rank=0, world=1, local_rank=0, seed=0, epoch=0, batch_size=1, drop_last=False,
                               **given)
    for name in mine:
        if sent.get(name) != given[name]:
            problems.append(f"hello_message({name}={given[name]!r}) sends {name} {sent.get(name)!r}")

    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(json.dumps({"settings": len(mine)}))


if __name__ == "__main__":
    main(sys.argv[1:])
