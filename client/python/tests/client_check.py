"""Checks of the client's behaviour against a shardload server, for the integration
tests (integration/client_test.go). Each mode prints JSON lines; the Go test compares
them with what the shards hold or what the Go library reads.

    client_check.py keep SOCKET OUTPUT         batches kept past their step, then a normal loop
    client_check.py workers SOCKET             ShardloadDataset under DataLoader workers
    client_check.py break SOCKET               leaving an epoch early, then the next epoch
    client_check.py noserver DEAD_SOCKET DIR   connecting where no server listens
    client_check.py dist SOCKET_A SOCKET_B     the order check across a torch.distributed world
    client_check.py expect SOCKET              the order check against $SHARDLOAD_EXPECT_ORDER
    client_check.py fake DIR                   protocol cases against a scripted server in this process
    client_check.py state SOCKET               state_dict/load_state_dict of the client and the dataset
    client_check.py messages                   the messages of ranks that disagree on settings

The modes read fields jpg, label=cls:int and txt (dist: cls:int) with seed 5 and batch
size 8.
"""

import json
import os
import socket
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import shardload  # noqa: E402

FIELDS = ["jpg", "label=cls:int", "txt"]
SEED = 5
BATCH = 8


def emit(**obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def values(col):
    """A fixed column's values as a list (numpy array, tensor or memoryview)."""
    return col.tolist()


def row_bytes(row):
    if isinstance(row, memoryview):
        return bytes(row)
    if hasattr(row, "numpy"):
        return row.numpy().tobytes()  # a torch tensor
    return row.tobytes()


def readonly(col):
    if isinstance(col, memoryview):
        return col.readonly
    flags = getattr(col, "flags", None)
    return None if flags is None else not flags.writeable


def error_line(e):
    return {"error": type(e).__name__, "shardload": isinstance(e, shardload.ShardloadError), "message": str(e)}


# -- keep --

def keep_phase(c):
    """Read epoch 0, keeping labels of the first 10 steps and more, as a trainer that
    logs them would. Returns what it kept (views, not copies)."""
    kept = {"labels": [], "ragged": None, "explicit": None, "to_torch": None}
    ro = []
    for step, b in enumerate(c):
        lab = b["label"]
        ro.append(readonly(lab))
        if step < 10:
            kept["labels"].append((b.keys, lab))
        if step == 3:
            kept["ragged"] = (b.keys, b["txt"])
        if step == 2:
            kept["to_torch"] = (b.keys, b.to_torch()["label"])
        if step == 5:
            # Released by the trainer while it holds a tensor and a row of it.
            t, row = b["label"], b["txt"][1]
            b.release()
            try:
                b["label"]
                after = None
            except shardload.ShardloadError as e:
                after = str(e)
            kept["explicit"] = (b.keys, t, row, after)
    return kept, ro


def normal_phase(c, epoch):
    """An epoch of a loop that keeps nothing past its step."""
    before = dict(c.stats)
    total = 0
    last = None
    for b in c.epoch(epoch):
        x = b["label"]
        y = b["txt"][0]
        total += int(x.sum() if hasattr(x, "sum") else sum(x.tolist())) + len(y)
        last = b
    try:
        last["label"]
        after = None
    except shardload.ShardloadError as e:
        after = str(e)
    return {"detached": c.stats["detached"] - before["detached"],
            "deferred": c.stats["deferred"] - before["deferred"],
            "released": c.stats["released"] - before["released"],
            "after_release": after, "keys_after_release": len(last.keys)}


def keep(sock, output):
    if output == "torch":
        # The client silences torch's warning about read-only arrays; fail if it shows.
        warnings.filterwarnings("error", message="The given NumPy array is not writable")
    c = shardload.Client(sock, batch_size=BATCH, fields=FIELDS, seed=SEED, output=output)
    emit(ready={"batches": c.batches_per_epoch, "slabs": len(c.slab_addresses()), "order": c.order,
                "placement": c.placement})
    kept, ro = keep_phase(c)
    detached_keeping = c.stats["detached"]
    normal = normal_phase(c, 1)
    c.close()
    # Everything kept is read now: after other batches filled the slabs, and after close.
    emit(labels=[{"keys": k, "labels": values(v)} for k, v in kept["labels"]],
         ragged={"keys": kept["ragged"][0], "rows": [row_bytes(r).decode(errors="replace") for r in kept["ragged"][1]]},
         explicit={"keys": kept["explicit"][0], "labels": values(kept["explicit"][1]),
                   "row1": row_bytes(kept["explicit"][2]).decode(errors="replace"), "after_release": kept["explicit"][3]},
         to_torch={"keys": kept["to_torch"][0], "labels": values(kept["to_torch"][1])},
         readonly=ro, detached_keeping=detached_keeping, normal=normal, stats=c.stats)


# -- workers --

def workers(sock):
    import torch
    from shardload.pytorch import ShardloadDataset
    ds = ShardloadDataset(socket_path=sock, batch_size=BATCH, fields=FIELDS, seed=SEED)
    for n in (2, 0, 1):
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=n)
        try:
            keys = []
            ds.set_epoch(0)
            for batch in loader:
                keys.extend(batch["__key__"])
            emit(workers=n, keys=keys)
        except Exception as e:  # DataLoader re-raises a worker's error as its type
            emit(workers=n, **error_line(e))
    ds.close()


def counts(sock):
    """Whether the server's counts are estimates, and what one epoch holds."""
    c = shardload.Client(sock, batch_size=BATCH, fields=FIELDS, seed=SEED)
    emit(estimated=c.counts_estimated, batches=c.batches_per_epoch)
    keys = []
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", shardload.ShardloadWarning)
        for b in c:
            n += 1
            keys.extend(b.keys[:b.rows - b.padded])
    e = c.last_epoch
    emit(got=len(keys), distinct=len(set(keys)), yielded=n, padded=e["padded"], left_out=e["left_out"])
    c.close()


# -- messages --

def messages():
    """What a trainer reads when its ranks disagree on settings (no server needed)."""
    from shardload.order import _order_difference
    settings = {"dataset": "d", "seed": 0, "world": 2, "batch_size": 8, "lanes": 4}
    for case, other in (("seed", dict(settings, seed=1)), ("lanes", dict(settings, lanes=2))):
        emit(case=case, message=_order_difference(1, {"settings": other}, 0, {"settings": settings}))


# -- break --

def batch_keys(batches):
    return [b.keys for b in batches]


def break_client(sock):
    c = shardload.Client(sock, batch_size=BATCH, fields=FIELDS, seed=SEED)
    it0 = iter(c)
    next(it0)
    b1 = next(it0)
    held = (b1.keys, b1["label"])
    e1 = c.epoch(1)
    first = next(e1)
    abandoned = c.last_end
    keys = [first.keys] + batch_keys(e1)
    released = c.stats["released"]
    stale = next(it0, "stopped")  # the generator of epoch 0 yields nothing more...
    stale = stale if stale == "stopped" else "yielded a batch"
    emit(what="client", epoch=1, batches=keys, abandoned_end=abandoned,
         stale=stale, stale_released=c.stats["released"] - released,  # ...and releases nothing
         held={"keys": held[0], "labels": values(held[1])}, stats=c.stats)
    # Break at the last batch of epoch 1 (its end may already be on its way), then epoch 2.
    for b in c.epoch(2):
        if b.seq == c.batches_per_epoch - 1:
            break
    emit(what="client", epoch=3, batches=batch_keys(c.epoch(3)))
    c.close()
    with shardload.Client(sock, batch_size=BATCH, fields=FIELDS, seed=SEED, epoch=1) as f:
        emit(what="fresh", epoch=1, batches=batch_keys(f))


def break_dataset(sock):
    import torch
    from shardload.pytorch import ShardloadDataset
    ds = ShardloadDataset(sock, batch_size=BATCH, fields=FIELDS, seed=SEED)  # the socket positionally, as Client
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for i, batch in enumerate(loader):  # epoch 0
        if i == 1:
            break
    emit(what="dataset", epoch=1, batches=[b["__key__"] for b in loader])
    ds.set_epoch(3)
    for batch in loader:
        break
    ds.set_epoch(4)
    emit(what="dataset", epoch=4, batches=[b["__key__"] for b in loader])
    ds.close()


# -- state --

STATE_TYPES = {"epoch": int, "order": str, "samples": int, "runs": str, "batches": int}


def state_problem(what, st):
    """What is wrong with st as a state_dict(): a plain dict of the five members, each
    an int or a string (None when nothing is)."""
    if type(st) is not dict or set(st) != set(STATE_TYPES):
        return f"{what}: {st!r} is not a plain dict of {sorted(STATE_TYPES)}"
    for k, kind in STATE_TYPES.items():
        if type(st[k]) is not kind:
            return f"{what}: {k} {st[k]!r} is a {type(st[k]).__name__}, want {kind.__name__}"
    return None


def state(sock):
    """Client.state_dict/load_state_dict and ShardloadDataset's, against a real server:
    one emit with the keys of epoch 0 and 1 read without a state (for the Go test to
    compare with the library) and the problems found."""
    import io
    import torch
    from shardload.pytorch import ShardloadDataset
    problems = []

    def check(what, st):
        p = state_problem(what, st)
        if p:
            problems.append(p)

    def client(**kw):
        return shardload.Client(sock, batch_size=BATCH, fields=FIELDS, seed=SEED, **kw)

    # The uninterrupted epochs, with the state after each batch.
    c = client()
    start = c.state_dict()
    check("before the first batch", start)
    if start.get("epoch") != 0 or start.get("batches") != 0 or start.get("runs") != "" or not start.get("order"):
        problems.append(f"state before the first batch {start}: want the start of epoch 0")
    keys, states = [], []
    for b in c:
        st = c.state_dict()
        check(f"after batch {b.seq}", st)
        if st != b.state or st.get("batches") != b.seq + 1:
            problems.append(f"after batch {b.seq}: state_dict {st}, batch.state {b.state}")
        keys.append(b.keys)
        states.append(st)
    after = c.state_dict()
    if after != {"epoch": 1, "order": start["order"], "samples": start["samples"], "runs": "", "batches": 0}:
        problems.append(f"state after epoch 0's end {after}: want the start of epoch 1")
    keys1 = [b.keys for b in c.epoch(1)]
    c.close()

    # A client made with a state reads the rest of the epoch, then the next.
    for k in (1, 7, len(keys)):
        with client(state=states[k - 1]) as r:
            if r.state_dict() != states[k - 1]:
                problems.append(f"state=after {k} batches: state_dict before a batch {r.state_dict()}")
            if r.batches_per_epoch != len(keys) - k:
                problems.append(f"state=after {k} batches: ready says {r.batches_per_epoch} batches, "
                                f"want {len(keys) - k}")
            got = [(b.seq, b.keys) for b in r]
            if got != list(enumerate(keys))[k:]:
                problems.append(f"state=after {k} batches: read {got}, want {list(enumerate(keys))[k:]}")
            if [b.keys for b in r.epoch(1)] != keys1:
                problems.append(f"state=after {k} batches: epoch 1 differs")

    # load_state_dict on a connected client: the next iteration resumes there,
    # abandoning the epoch being read; epoch(n) of another epoch is refused.
    with client() as r:
        it = iter(r)
        next(it)
        next(it)
        r.load_state_dict(states[9])
        try:
            r.epoch(1)
            problems.append("epoch(1) after load_state_dict of a state of epoch 0: no error")
        except ValueError:
            pass
        got = [b.keys for b in r]
        if got != keys[10:]:
            problems.append(f"load_state_dict(after 10 batches) mid-epoch: read {got}, want {keys[10:]}")
        r.load_state_dict(after)  # the start of epoch 1
        if [b.keys for b in r.epoch()] != keys1:
            problems.append("load_state_dict(start of epoch 1) then epoch(): epoch 1 differs")

    # States that do not fit.
    for what, bad, err in [
        ("a checkpoint instead of its state", {"model": {}, "data": states[0]}, ValueError),
        ("a float", dict(states[0], batches=1.0), ValueError),
        ("epoch and state differ", None, ValueError),
        ("another order", dict(states[3], order="0123456789abcdef"), shardload.ServerError),
        ("bad runs", dict(states[3], runs="1y8"), shardload.ServerError),
    ]:
        try:
            if bad is None:
                client(epoch=2, state=states[3]).close()
            else:
                client(state=bad).close()
            problems.append(f"{what}: no error")
        except err as e:
            if isinstance(e, shardload.ServerError) and e.code != "resume":
                problems.append(f"{what}: code {e.code} ({e.message}), want resume")
        except Exception as e:
            problems.append(f"{what}: {type(e).__name__}: {e}, want {err.__name__}")

    # ShardloadDataset: torch.save carries its state; a fresh dataset loaded with it
    # resumes, and its next iter() reads the next epoch.
    ds = ShardloadDataset(socket_path=sock, batch_size=BATCH, fields=FIELDS, seed=SEED)
    fresh = ds.state_dict()
    if fresh != {"epoch": 0, "order": "", "samples": 0, "runs": "", "batches": 0}:
        problems.append(f"dataset state before any iter(): {fresh}")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    buf, got = io.BytesIO(), []
    for i, batch in enumerate(loader):
        got.append(batch["__key__"])
        if i == 4:
            torch.save({"model": {}, "data": ds.state_dict(), "step": 5}, buf)
    if got != keys:
        problems.append("dataset epoch 0 differs from the client's")
    check("dataset after an epoch", ds.state_dict())
    if ds.state_dict() != after:
        problems.append(f"dataset state after epoch 0 {ds.state_dict()}, want {after}")
    ds.close()
    buf.seek(0)
    saved = torch.load(buf)["data"]
    check("dataset state through torch.save", saved)
    ds = ShardloadDataset(socket_path=sock, batch_size=BATCH, fields=FIELDS, seed=SEED)
    ds.load_state_dict(saved)
    ds.set_epoch(0)  # the state's epoch: kept
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    if [b["__key__"] for b in loader] != keys[5:]:
        problems.append("dataset resumed after 5 batches: the rest of epoch 0 differs")
    if [b["__key__"] for b in loader] != keys1:
        problems.append("dataset resumed: the next epoch is not epoch 1")
    ds.close()

    # The calls torchdata's StatefulDataLoader makes (num_workers=0): it may make an
    # iterator and drop it unused, and asks for the state between batches.
    ds = ShardloadDataset(socket_path=sock, batch_size=BATCH, fields=FIELDS, seed=SEED)
    iter(ds)  # made for a state_dict() before the first batch, never run
    if ds.state_dict()["epoch"] != 0:
        problems.append(f"an iterator made and dropped moved the dataset on: {ds.state_dict()}")
    ds.load_state_dict(after)  # saved once epoch 0 had ended
    iter(ds)  # the resumed loader's iterator, found finished and replaced
    it = iter(ds)
    first = next(it, {"__key__": "nothing"})
    if first["__key__"] != keys1[0] or ds.state_dict() != dict(after, runs="1x8", batches=1):
        problems.append(f"resumed at the start of epoch 1: first batch {first['__key__']}, state {ds.state_dict()}")
    ds.close()
    emit(epoch0=keys, epoch1=keys1, problems=problems)


# -- noserver --

def try_client(case, path, **kw):
    try:
        shardload.Client(path, batch_size=BATCH, **kw).close()
        emit(case=case, error=None)
    except Exception as e:
        emit(case=case, **error_line(e))


def noserver(dead, d):
    try_client("killed-server", dead)
    p = os.path.join(d, "bound.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(p)
    s.close()
    try_client("bound-closed", p)
    try_client("missing", os.path.join(d, "missing.sock"))
    p = os.path.join(d, "stream.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(p)
    s.listen()
    try_client("stream-socket", p)
    s.close()
    p = os.path.join(d, "silent.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(p)
    s.listen()  # connects, and never answers
    try_client("silent", p, timeout=0.5)
    s.close()


# -- dist --

def dist(sock_a, sock_b):
    """Clients on SOCK_A (servers that differ), then SOCK_B (servers that agree), then
    SOCK_A comparing with all_gather_object instead of the store, then one on rank 0
    alone (the others create none)."""
    import datetime
    import torch.distributed as td
    from torch.distributed import distributed_c10d as c10d
    td.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    get_store = c10d._get_default_store
    for what, sock in (("first", sock_a), ("second", sock_b), ("gather", sock_a), ("missing", sock_b)):
        if what == "gather":
            del c10d._get_default_store  # as in a torch without it
        else:
            c10d._get_default_store = get_store
        if what == "missing" and td.get_rank() != 0:
            continue
        try:
            c = shardload.Client(sock, batch_size=BATCH, fields=["cls:int"], seed=SEED,
                                 check_timeout=1 if what == "missing" else 60)
        except shardload.ShardloadError as e:
            emit(what=what, rank=td.get_rank(), **error_line(e))
            continue
        keys = []
        for b in c:
            keys.extend(b.keys[:b.rows - b.padded])
        emit(what=what, rank=td.get_rank(), order=c.order, keys=keys)
        c.close()
    # An orderly end: a rank that exits while a peer's gloo connections are still
    # open can abort in gloo's threads ("terminate called without an active
    # exception"), as seen under load.
    td.barrier()
    td.destroy_process_group()


# -- expect --

def expect(sock):
    with shardload.Client(sock, batch_size=BATCH, fields=FIELDS, seed=SEED) as c:
        fp = c.order["fingerprint"]
    for case, value in (("right", fp), ("wrong", "0123456789abcdef")):
        os.environ["SHARDLOAD_EXPECT_ORDER"] = value
        try_client(case, sock, fields=FIELDS, seed=SEED)


# -- fake: a scripted server in a thread --

class FakeServer:
    """Serves one connection with a script (a function of the server), recording the
    messages the client sends. Slabs are memfds of 4096 bytes; a batch has 2 rows: a
    "label" int64 column and the keys."""

    SLAB = 4096

    def __init__(self, path, script, slabs=3):
        import threading
        self.path, self.script, self.got, self.problems = path, script, [], []
        self.fds = []
        self.maps = []
        import mmap
        for i in range(slabs):
            fd = os.memfd_create(f"fake{i}")
            os.ftruncate(fd, self.SLAB)
            self.fds.append(fd)
            self.maps.append(mmap.mmap(fd, self.SLAB))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen()
        self.thread = threading.Thread(target=self._run, daemon=True)  # a failing client ends the script
        self.thread.start()

    def _run(self):
        conn, _ = self.listener.accept()
        self.conn = conn
        conn.settimeout(30)
        try:
            self.script(self)
        except Exception as e:  # reported by the test
            self.problems.append(f"fake server: {type(e).__name__}: {e}")
        finally:
            conn.close()
            self.listener.close()

    def recv(self):
        b = self.conn.recv(1 << 16)
        m = json.loads(b) if b else {"type": "closed"}
        self.got.append(m)
        return m

    def recv_until(self, typ):
        while True:
            m = self.recv()
            if m["type"] in (typ, "closed"):
                return m

    def send(self, obj, fds=None):
        if fds:
            socket.send_fds(self.conn, [json.dumps(obj).encode()], fds)
        else:
            self.conn.send(json.dumps(obj).encode())

    def ready(self, extra=None):
        hello = self.recv()
        r = {"type": "ready", "version": shardload.PROTOCOL_VERSION, "session": 1, "slabs": len(self.fds),
             "slab_bytes": self.SLAB, "fields": [{"name": "label", "ext": "cls", "kind": "int"}],
             "epoch": hello["epoch"], "batches": 4, "samples": 8, "shards": 1}
        r.update(extra or {})
        self.send(r, self.fds)
        return hello

    @staticmethod
    def labels(epoch, seq):
        return [1000 * epoch + 10 * seq, 1000 * epoch + 10 * seq + 1]

    def batch(self, epoch, seq, slab):
        """Write batch (epoch, seq) into slab and announce it."""
        import struct
        keys = [f"e{epoch}s{seq}r{i}".encode() for i in range(2)]
        mm = self.maps[slab]
        mm[0:16] = struct.pack("<2q", *self.labels(epoch, seq))
        data = b"".join(keys)
        mm[64:64 + len(data)] = data
        mm[128:152] = struct.pack("<3q", 0, len(keys[0]), len(data))
        self.send({"type": "batch", "epoch": epoch, "seq": seq, "slab": slab, "rows": 2, "padded": 0, "used": 152,
                   "columns": [
                       {"name": "label", "kind": "int", "dtype": "<i8", "shape": [2], "offset": 0, "length": 16,
                        "ragged": False, "offsets_offset": 0},
                       {"name": "__key__", "kind": "text", "dtype": "|u1", "shape": [len(data)], "offset": 64,
                        "length": len(data), "ragged": True, "offsets_offset": 128}]})

    def end(self, epoch, batches, abandoned=False):
        self.send({"type": "end", "epoch": epoch, "batches": batches, "samples": 2 * batches, "skipped": 0,
                   "padded": 0, "abandoned": abandoned})

    def finish(self):
        self.thread.join(60)
        if self.thread.is_alive():
            self.problems.append("the fake server did not finish")
        return [m for m in self.got if m["type"] != "hello"]


def releases(got):
    return [(m["slab"], m["seq"], m.get("epoch")) for m in got if m["type"] == "release"]


def fake_abandon(d):
    """Leave epoch 0 after one batch while holding its labels. The server had sent a
    second batch, sends a third after the epoch message, then the abandoned end, and
    refills the slabs with epoch 1."""
    def script(s):
        s.ready()
        s.batch(0, 0, 0)
        s.batch(0, 1, 1)
        s.recv_until("epoch")
        s.batch(0, 2, 2)  # was on its way
        s.end(0, 3, abandoned=True)
        s.batch(1, 0, 0)  # the server took slab 0 back: epoch 1 overwrites it
        s.batch(1, 1, 1)
        s.end(1, 2)
        s.recv_until("closed")
    s = FakeServer(os.path.join(d, "abandon.sock"), script)
    c = shardload.Client(s.path, batch_size=2)
    it = iter(c)
    b0 = next(it)
    held = b0["label"]
    epoch1 = [(b.keys, b["label"].tolist()) for b in c.epoch(1)]
    c.close()
    got = s.finish()
    problems = s.problems
    i = next((n for n, m in enumerate(got) if m["type"] == "epoch"), None)
    if i is None:
        problems.append(f"no epoch message: {got}")
    else:
        if releases(got[:i]) != [(0, 0, 0)]:
            problems.append(f"releases before the epoch message {releases(got[:i])}, want [(0, 0, 0)]: batch 0 "
                            "(copied out, as its labels were held), and not batch 1, which the server takes back")
        if any(r[2] != 1 for r in releases(got[i:])):
            problems.append(f"releases of epoch 0 after the epoch message: {releases(got[i:])}")
    if held.tolist() != FakeServer.labels(0, 0):
        problems.append(f"labels held across the abandon read {held.tolist()}, want {FakeServer.labels(0, 0)}")
    want = [([f"e1s{q}r0", f"e1s{q}r1"], FakeServer.labels(1, q)) for q in range(2)]
    if epoch1 != want:
        problems.append(f"epoch 1 read {epoch1}, want {want}")
    if c.stats["detached"] != 1:
        problems.append(f"{c.stats['detached']} detaches, want 1 (the held batch)")
    emit(case="abandon", problems=problems, got=got)


def fake_race(d):
    """The loop leaves epoch 0 after its first batch, but the server had sent the whole
    epoch and its end before the epoch message came: the end is not "abandoned", and
    the batch the client dropped is the client's to release."""
    def script(s):
        s.ready()
        s.batch(0, 0, 0)
        s.batch(0, 1, 1)
        s.end(0, 2)
        s.recv_until("epoch")
        m = s.recv()
        if m["type"] != "release" or (m["slab"], m["seq"], m.get("epoch")) != (1, 1, 0):
            s.problems.append(f"after the epoch message: {m}, want the release of slab 1, batch 1 of epoch 0")
        s.batch(1, 0, 1)
        s.end(1, 1)
        s.recv_until("closed")
    s = FakeServer(os.path.join(d, "race.sock"), script)
    c = shardload.Client(s.path, batch_size=2)
    for b in c:
        break
    epoch1 = [b.keys for b in c.epoch(1)]
    c.close()
    got = s.finish()
    problems = s.problems
    if epoch1 != [["e1s0r0", "e1s0r1"]]:
        problems.append(f"epoch 1 read {epoch1}")
    emit(case="race", problems=problems, got=got)


def fake_twice(d):
    """epoch(1) then epoch(2) at once: the client reads epoch 0's end before it
    abandons epoch 1, so that the server never sees two epoch messages before an end."""
    def script(s):
        s.ready()
        s.batch(0, 0, 0)
        s.recv_until("epoch")
        s.end(0, 1, abandoned=True)
        s.batch(1, 0, 1)
        m = s.recv_until("epoch")
        if m.get("epoch") != 2:
            s.problems.append(f"second epoch message {m}")
        s.end(1, 1, abandoned=True)
        s.batch(2, 0, 2)
        s.end(2, 1)
        s.recv_until("closed")
    s = FakeServer(os.path.join(d, "twice.sock"), script)
    c = shardload.Client(s.path, batch_size=2)
    c.epoch(1)
    epoch2 = [b.keys for b in c.epoch(2)]
    c.close()
    got = s.finish()
    problems = s.problems
    if epoch2 != [["e2s0r0", "e2s0r1"]]:
        problems.append(f"epoch 2 read {epoch2}")
    if releases(got) != [(2, 0, 2)] and releases(got) != []:
        problems.append(f"releases {releases(got)}: the batches of abandoned epochs are the server's")
    emit(case="twice", problems=problems, got=got)


def fake_held(d):
    """With auto_release=False, a batch held after its epoch's normal end may be
    released during the next epoch, no later: the switch to the epoch after releases
    it (and only it)."""
    def script(s):
        s.ready()
        s.batch(0, 0, 0)
        s.end(0, 1)
        s.recv_until("epoch")
        s.batch(1, 0, 1)
        s.end(1, 1)
        s.recv_until("epoch")
        s.batch(2, 0, 2)
        s.end(2, 1)
        s.recv_until("closed")
    s = FakeServer(os.path.join(d, "held.sock"), script)
    c = shardload.Client(s.path, batch_size=2)
    held = [b for b in c.batches(auto_release=False)]
    held += [b for b in c.epoch(1, auto_release=False)]
    released = [b.released for b in held]
    held += [b for b in c.epoch(2, auto_release=False)]
    released += [b.released for b in held[:2]]
    c.close()
    got = s.finish()
    problems = s.problems
    epochs = [n for n, m in enumerate(got) if m["type"] == "epoch"]
    if len(epochs) != 2:
        problems.append(f"epoch messages: {got}")
    else:
        if releases(got[:epochs[0]]) or releases(got[epochs[0]:epochs[1]]) != [(0, 0, 0)]:
            problems.append(f"releases {releases(got)}: want batch 0 of epoch 0 released just before "
                            "the epoch 2 message, and nothing else")
    if released != [False, False, True, False]:
        problems.append(f"Batch.released of epochs 0 and 1 after epoch(1), then after epoch(2): {released}")
    emit(case="held", problems=problems, got=got)


def fake_hello(d):
    """gpu_pci in the hello: sent when CUDA is initialised already, never initialising
    it (a stand-in torch module records whether the client asked for device properties
    with CUDA not initialised); cuda_visible_devices when set to a list the server
    takes."""
    import types
    state = {"init": False, "asked": False}

    def props(i):
        if not state["init"]:
            state["asked"] = True
        return types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3b + i, pci_device_id=0)

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: state["init"],
                                      current_device=lambda: 1, get_device_properties=props)
    sys.modules["torch"] = fake
    problems = []
    cases = [
        ("cuda not initialised", False, None, None, "1,0"),
        ("cuda not initialised, device=3", False, 3, None, "GPU-8f0c2a1e-0a1b-4c2d-9e3f-001122334455"),
        ("current device", True, None, "0000:3c:00.0", None),
        ("device='cuda:2'", True, "cuda:2", "0000:3d:00.0", "0:1"),  # not a list the server takes
        ("device=torch.device('cuda', 0)", True, types.SimpleNamespace(type="cuda", index=0), "0000:3b:00.0", None),
        ("device='cpu'", True, "cpu", None, None),
    ]
    try:
        for n, (name, init, device, want, visible) in enumerate(cases):
            state["init"] = init
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            if visible is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible

            def script(s):
                s.recv()
                s.send({"type": "error", "code": "bad_request", "message": "fake"})
            s = FakeServer(os.path.join(d, f"hello{n}.sock"), script)
            try:
                shardload.Client(s.path, device=device)
                problems.append(f"{name}: no error from the fake server")
            except shardload.ServerError:
                pass
            s.finish()
            hello = s.got[0] if s.got else {}
            if hello.get("gpu_pci") != want:
                problems.append(f"{name}: gpu_pci {hello.get('gpu_pci')!r}, want {want!r}")
            want_visible = None if visible == "0:1" else visible
            if hello.get("cuda_visible_devices") != want_visible:
                problems.append(f"{name}: cuda_visible_devices {hello.get('cuda_visible_devices')!r}, "
                                f"want {want_visible!r}")
        if state["asked"]:
            problems.append("device properties asked for with CUDA not initialised")
    finally:
        del sys.modules["torch"]
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    emit(case="hello", problems=problems)


def fake(d):
    fake_abandon(d)
    fake_race(d)
    fake_twice(d)
    fake_held(d)
    fake_hello(d)


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "keep":
        keep(*args)
    elif mode == "workers":
        workers(*args)
    elif mode == "counts":
        counts(*args)
    elif mode == "messages":
        messages(*args)
    elif mode == "break":
        break_client(*args)
        break_dataset(*args)
    elif mode == "noserver":
        noserver(*args)
    elif mode == "dist":
        dist(*args)
    elif mode == "expect":
        expect(*args)
    elif mode == "fake":
        fake(*args)
    elif mode == "state":
        state(*args)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
