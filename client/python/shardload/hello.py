"""The hello (docs/protocol.md, hello): the client's first message, built from
Client's arguments (hello_message, a pure function), with the settings a trainer may
give (SETTINGS) and a mix's streams (stream_specs)."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, cast

from .messages import CLIENT_NAME, PROTOCOL_VERSION, HelloMessage, Message, State, StreamSpec

# The settings (version 4) a hello may carry as members of its own, each overriding
# the server's: the Client's (and hello_message's) keyword arguments of those names.
# The one table of them in the client: the Go table shardload.Knobs names the
# same ones (each Knob's Hello), as the integration test
# TestPythonSettingsAreTheKnobs checks (client/python/tests/settings_check.py).
SETTINGS: Tuple[str, ...] = ("allow_estimate", "count_first", "slab_bytes", "slabs", "shuffle",
                             "shuffle_buffer", "shuffle_bytes", "open_shards", "read_gap",
                             "ranks_per_node", "node_affinity")

# The settings sent only when true (False: the server's default).
_FLAGS = ("allow_estimate", "count_first")

BATCHINGS: Tuple[str, ...] = ("random", "stratified", "per_stream")


def hello_message(*, rank: int, world: int, local_rank: int, seed: int, epoch: int, batch_size: int,
                  drop_last: bool, fields: Optional[Iterable[str]] = None, urls: Optional[Iterable[str]] = None,
                  image_layout: str = "hwc", state: Optional[State] = None, gpu_pci: Optional[str] = None,
                  cuda_visible_devices: Optional[str] = None, allow_estimate: bool = False,
                  count_first: bool = False, slab_bytes: Optional[int] = None, slabs: Optional[int] = None,
                  shuffle: Optional[bool] = None, shuffle_buffer: Optional[int] = None,
                  shuffle_bytes: Optional[int] = None, open_shards: Optional[int] = None,
                  read_gap: Optional[int] = None, ranks_per_node: Optional[int] = None,
                  node_affinity: Optional[bool] = None, streams: Optional[Iterable[Mapping[str, Any]]] = None,
                  epoch_samples: Optional[int] = None, batching: Optional[str] = None,
                  pack: Optional[str] = None, epoch_tokens: Optional[int] = None) -> HelloMessage:
    """The hello for the Client's settings (a pure function: Client passes its
    arguments, the GPU's PCI address it found and $CUDA_VISIBLE_DEVICES). Settings left
    None, and a false allow_estimate or count_first, are left out: the server's hold.
    cuda_visible_devices is sent when it is a list the server takes. Raises ValueError
    for an image_layout other than "chw" and "hwc", and for a setting that is not a
    non-negative int, and for streams that are not a list of {"urls": ..., "weight" or
    "repeat" or "choose": ...}."""
    given: Dict[str, Any] = dict(locals())  # the arguments, SETTINGS' among them
    hello: Message = {
        "type": "hello", "version": PROTOCOL_VERSION, "rank": rank, "world": world,
        "local_rank": local_rank, "seed": seed, "epoch": epoch, "batch_size": batch_size,
        "drop_last": drop_last, "client": CLIENT_NAME,
    }
    if fields:
        hello["fields"] = list(fields)
    if urls:
        hello["urls"] = list(urls)
    if image_layout not in ("chw", "hwc"):
        raise ValueError(f"image_layout {image_layout!r}: want 'chw' or 'hwc'")
    hello["image_layout"] = image_layout
    for name in SETTINGS:
        value = given[name]
        if value is None or value is False and name in _FLAGS:
            continue
        if name not in ("shuffle", "node_affinity") and not isinstance(value, bool) and (not isinstance(value, int) or value < 0):
            raise ValueError(f"{name}={value!r}: want a non-negative int")
        hello[name] = value
    if urls and streams:
        raise ValueError("urls and streams: give one or the other")
    if streams is not None:
        hello["streams"] = stream_specs(streams)
    if epoch_samples is not None:
        if isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int) or epoch_samples < 0:
            raise ValueError(f"epoch_samples={epoch_samples!r}: want a non-negative int")
        hello["epoch_samples"] = epoch_samples
    if batching is not None:
        if batching not in BATCHINGS:
            raise ValueError(f"batching={batching!r}: want one of {', '.join(BATCHINGS)}")
        hello["batching"] = batching
    if pack is not None:
        if not isinstance(pack, str) or pack.count(":") < 1 or not pack.split(":")[0]:
            raise ValueError(f"pack={pack!r}: want 'FIELD:SEQ_LEN[:eos=ID][:pad=ID]', e.g. 'tokens:2048:eos=0'")
        hello["pack"] = pack
    if epoch_tokens is not None:
        if isinstance(epoch_tokens, bool) or not isinstance(epoch_tokens, int) or epoch_tokens < 0:
            raise ValueError(f"epoch_tokens={epoch_tokens!r}: want a non-negative int")
        hello["epoch_tokens"] = epoch_tokens
    if state is not None:
        hello["state"] = state
    if gpu_pci:
        hello["gpu_pci"] = gpu_pci
    visible = cuda_visible_devices or ""
    if visible and len(visible) <= 1024 and all(c.isascii() and (c.isalnum() or c in ",-/ ") for c in visible):
        # Without gpu_pci, the server maps local_rank through it to a GPU.
        hello["cuda_visible_devices"] = visible
    return cast(HelloMessage, hello)


def stream_specs(streams: Iterable[Mapping[str, Any]]) -> List[StreamSpec]:
    """The hello's streams for a mix given as dicts: "urls" (a pattern or a list of
    them) and at most one of "weight", "repeat" and "choose". Raises ValueError for
    anything else."""
    out: List[StreamSpec] = []
    for i, st in enumerate(streams):
        if not isinstance(st, Mapping):
            raise ValueError(f"stream {i}: {st!r} is not a dict with urls and a weight")
        unknown = set(st) - {"urls", "weight", "repeat", "choose"}
        if unknown:
            raise ValueError(f"stream {i}: unknown keys {sorted(unknown)} (urls, weight, repeat, choose)")
        urls = st.get("urls")
        if isinstance(urls, str):
            urls = [urls]
        if not urls or not all(isinstance(u, str) and u for u in urls):
            raise ValueError(f"stream {i}: urls {urls!r}: want a pattern or a list of them")
        spec: StreamSpec = {"urls": list(urls)}
        given = [k for k in ("weight", "repeat", "choose") if st.get(k) is not None]
        if len(given) > 1:
            raise ValueError(f"stream {i}: {' and '.join(given)}: give one of weight, repeat and choose")
        for k in given:
            v = st[k]
            ok = isinstance(v, int) if k == "choose" else isinstance(v, (int, float))
            if isinstance(v, bool) or not ok or not v > 0 or v != v or v == float("inf"):
                raise ValueError(f"stream {i}: {k}={v!r}: want a positive {'int' if k == 'choose' else 'number'}")
            spec[k] = v  # type: ignore[literal-required]
        out.append(spec)
    if not out:
        raise ValueError("streams: none given")
    return out
