"""The trainer's GPU, as the hello names it: Client's ``device`` argument, and its PCI
address when CUDA can tell it without being initialised by the client."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # optional at run time
    import torch

# What Client's device may be: a CUDA ordinal, "cuda:N" ("cuda": the current device;
# any other type: no CUDA device) or a torch.device.
Device = Union[int, str, "torch.device"]


def parse_device(device: Any) -> Union[int, str, None]:
    """A CUDA ordinal, "current" (the current device), or None (not a CUDA device)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise ValueError(f"device {device!r}: want a CUDA ordinal, 'cuda:N' or a torch.device")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device {device}: a CUDA ordinal is >= 0")
        return device
    if isinstance(device, str):
        scheme, _, idx = device.partition(":")
        if scheme != "cuda":
            return None
        if not idx:
            return "current"
        if not idx.isdigit():
            raise ValueError(f"device {device!r}: want 'cuda:N'")
        return int(idx)
    kind = getattr(device, "type", None)
    if kind is None:
        raise ValueError(f"device {device!r}: want a CUDA ordinal, 'cuda:N' or a torch.device")
    if kind != "cuda":
        return None
    return "current" if device.index is None else device.index


def gpu_pci(device: Union[int, str, None]) -> Optional[str]:
    """The PCI address of the trainer's GPU when it can be known without initialising
    CUDA: torch must be imported and CUDA initialised already. None otherwise."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None:
        return None
    try:
        if not cuda.is_initialized():  # (is_available() may itself initialise the driver)
            return None
        if device is None or device == "current":
            device = cuda.current_device()
        p = cuda.get_device_properties(device)
        bus, dev = getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None)
        if bus is None or dev is None:
            return None
        return "%04x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0) or 0, bus, dev)
    except Exception:  # a query that fails only loses a placement hint
        return None
