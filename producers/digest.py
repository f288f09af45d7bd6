"""Tensor digests: a short string that changes when any element's bits change.

Why digests and not norms: a norm or a sum misses updates that cancel out and is
blind to element order; comparing replicas across ranks or a parameter before and
after ``optimizer.step`` needs *bitwise* equality.  Two rules shape this module:

* **Every element counts and nothing large leaves the device.**  On CPU the raw bytes
  are hashed in place with xxh3 (a zero-copy uint8 view).  On an accelerator the bits
  are reinterpreted as integers and mixed with per-position constants by torch ops on
  the device; a wrapping integer sum reduces them to two 64-bit words, and only those
  words travel to the host.  Integer addition is associative, so the result does not
  depend on the reduction order a kernel chooses: equal tensors give equal digests
  on every rank.
* **Digests of different algorithms never compare equal by accident.**  Each digest
  is prefixed with its algorithm (``x3:`` or ``dv:``) and folds in dtype and shape.

Equality is bitwise: ``-0.0`` and ``0.0`` differ, NaNs with equal payloads are equal.
Meta and fake tensors have no data; they get ``None`` and a reason.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Sequence

import torch
import xxhash
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .digest_kernel import fused_words

if TYPE_CHECKING:
    from .readback import Readback

CPU_ALGORITHM = "x3"
DEVICE_ALGORITHM = "dv"

# splitmix64 constants, as signed int64 (torch has no uint64 arithmetic).
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB
_SECOND_SEED = 0x2545F4914F6CDD1D
#: Elements processed per chunk on the device path: bounds the temporary int64 buffers
#: to a few times 16 MiB whatever the parameter size.
_DEVICE_CHUNK = 1 << 21

_INT_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def skip_reason(tensor: torch.Tensor) -> str | None:
    """Return why this tensor cannot be digested, or None when it can."""
    if tensor.is_meta:
        return "meta"
    if type(tensor) not in _PLAIN_TYPES and _is_fake(tensor):
        return "fake"
    if tensor.layout != torch.strided:
        return "layout"
    if tensor.is_quantized:
        return "quantized"
    if type(tensor) not in _PLAIN_TYPES and is_traceable_wrapper_subclass(tensor):
        return "subclass"  # its data lives in inner tensors: no bytes of its own to read
    if not tensor.numel():
        return None
    address = data_address(tensor)
    if address is None:
        return "no storage"
    if address == 0 or (tensor.storage_offset() and tensor.untyped_storage().nbytes() == 0):
        # FSDP2 frees an unsharded parameter between uses by resizing its storage to
        # zero bytes: the tensor keeps its shape, and reading it would fault
        return "freed"
    return None


def data_address(tensor: torch.Tensor) -> int | None:
    """Where a tensor's data starts; None for empty and meta tensors and for torch.func's
    wrappers (vmap's batched, grad's tracking tensors), which have no storage."""
    if not tensor.numel() or tensor.device.type == "meta":
        return None
    try:
        return tensor.data_ptr()
    except RuntimeError:
        return None


def local_data(tensor: torch.Tensor) -> torch.Tensor:
    """What this process holds of a tensor: a DTensor's local shard, any other tensor itself.

    FSDP2 (``fully_shard``) and tensor parallelism make parameters DTensors, wrappers
    whose own storage is empty; their values and digests are those of the local shard.
    """
    if type(tensor) not in _PLAIN_TYPES and hasattr(tensor, "placements") and hasattr(tensor, "to_local"):
        return tensor.to_local()
    return tensor


def _is_fake(tensor: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover - older torch
        return False
    return isinstance(tensor, FakeTensor)


def _header(tensor: torch.Tensor) -> bytes:
    """dtype and shape are part of the identity: a reshaped tensor is a different value."""
    return f"{tensor.dtype}|{tuple(tensor.shape)}".encode()


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous, materialised view of the tensor's logical values."""
    plain = tensor.detach()
    if plain.is_conj():
        plain = plain.resolve_conj()
    if plain.is_neg():
        plain = plain.resolve_neg()
    return plain.contiguous()


def _as_integers(tensor: torch.Tensor) -> torch.Tensor:
    """Reinterpret the bits of a contiguous tensor as a flat integer tensor (no copy)."""
    flat = tensor.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    size = flat.element_size()
    int_dtype = _INT_BY_SIZE.get(size, torch.int64)
    if flat.dtype != int_dtype:
        flat = flat.view(int_dtype)  # 16-byte elements (complex128) become 2 int64 each
    return flat


_HEADERS: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}


def _cached_header(tensor: torch.Tensor) -> bytes:
    key = (tensor.dtype, tensor.shape)  # torch.Size is a hashable tuple
    header = _HEADERS.get(key)
    if header is None:
        header = _header(tensor)
        if len(_HEADERS) < 65536:  # bounded: shapes of one model's parameters
            _HEADERS[key] = header
    return header


_BYTE_ARRAYS: dict[int, type[ctypes.Array[ctypes.c_char]]] = {}


def _raw_bytes(tensor: torch.Tensor) -> ctypes.Array[ctypes.c_char]:
    """A zero-copy buffer over a contiguous CPU tensor's bytes, whatever its dtype.

    Cheaper per call than ``tensor.numpy()`` (the snapshot path digests many small
    tensors, where the fixed cost dominates), and it needs no integer reinterpretation
    for dtypes numpy lacks (bfloat16, float8).  The caller keeps ``tensor`` alive
    while the buffer is read.
    """
    size = tensor.numel() * tensor.element_size()
    array_type = _BYTE_ARRAYS.get(size)
    if array_type is None:
        array_type = ctypes.c_char * size
        if len(_BYTE_ARRAYS) < 65536:
            _BYTE_ARRAYS[size] = array_type
    return array_type.from_address(tensor.data_ptr())


def cpu_digest(tensor: torch.Tensor) -> str:
    """xxh3-64 over dtype, shape and the raw bytes, without copying contiguous tensors."""
    plain = tensor.detach() if tensor.requires_grad else tensor
    if plain.is_conj() or plain.is_neg() or not plain.is_contiguous():
        plain = _plain(plain)
    hasher = xxhash.xxh3_64(_cached_header(plain))
    if plain.numel():
        hasher.update(_raw_bytes(plain))
    return f"{CPU_ALGORITHM}:{hasher.hexdigest()}"


def _logical_shift_right(values: torch.Tensor, bits: int) -> torch.Tensor:
    # int64 >> is arithmetic; masking the sign-extended bits makes it logical.
    return (values >> bits) & ((1 << (64 - bits)) - 1)


def _mix(values: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser in wrapping int64 arithmetic (in place on ``values``)."""
    values ^= _logical_shift_right(values, 30)
    values *= _MIX1
    values ^= _logical_shift_right(values, 27)
    values *= _MIX2
    values ^= _logical_shift_right(values, 31)
    return values


def device_digest_words(tensor: torch.Tensor) -> torch.Tensor:
    """Two int64 words summarising every element, computed where the tensor lives.

    Each element's bits are combined with its position, mixed, and summed with
    wrapping arithmetic; the second word uses a different seed so the pair behaves
    like a 128-bit checksum.  The result stays on the device so that a caller can
    gather many of them and cross to the host once.  On CUDA one fused kernel computes
    the same words (`producers.digest_kernel`); elsewhere, torch ops.
    """
    raw = _as_integers(_plain(tensor))
    fused = fused_words(raw, reference_words)
    return fused if fused is not None else reference_words(raw)


def reference_words(raw: torch.Tensor) -> torch.Tensor:
    """The device words of a flat integer tensor by torch ops, in bounded chunks."""
    device = raw.device
    total = torch.zeros(2, dtype=torch.int64, device=device)
    count = raw.numel()
    for start in range(0, count, _DEVICE_CHUNK):
        chunk = raw[start : start + _DEVICE_CHUNK].to(torch.int64)
        if raw.dtype == torch.uint8:
            pass  # already non-negative
        elif raw.dtype != torch.int64:
            chunk &= (1 << (8 * raw.element_size())) - 1  # undo sign extension
        positions = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=device)
        keyed = _mix(positions * _GOLDEN + chunk)
        total[0] += _mix(keyed.clone()).sum()
        keyed += _SECOND_SEED
        total[1] += _mix(keyed).sum()
    return total


def format_device_digest(tensor: torch.Tensor, words: Sequence[int]) -> str:
    """Render device words as a digest string, folding in dtype and shape on the host."""
    return format_digest_words(_header(tensor), words)


def format_digest_words(header_bytes: bytes, words: Sequence[int]) -> str:
    """`format_device_digest` from the tensor's header alone (the tensor may be gone)."""
    header = xxhash.xxh3_64_intdigest(header_bytes)
    first = (int(words[0]) ^ header) & 0xFFFFFFFFFFFFFFFF
    second = int(words[1]) & 0xFFFFFFFFFFFFFFFF
    return f"{DEVICE_ALGORITHM}:{first:016x}{second:016x}"


def tensor_digest(tensor: torch.Tensor, *, on_device: bool | None = None) -> str | None:
    """Digest of one tensor; ``None`` when it has no data (see `skip_reason`).

    ``on_device`` picks the algorithm: None = by device (CPU -> xxh3, else the
    device reduction); True forces the device path, which is how it is tested on CPU.
    """
    if skip_reason(tensor) is not None:
        return None
    use_device_path = tensor.device.type != "cpu" if on_device is None else on_device
    if not use_device_path:
        return cpu_digest(tensor)
    words = device_digest_words(tensor).tolist()
    return format_device_digest(tensor, words)


def tensor_digests(
    tensors: Sequence[torch.Tensor | None], *, on_device: bool | None = None, readback: "Readback | None" = None
) -> list[Any]:
    """Digest many tensors with a single device-to-host transfer for the device path.

    With a ``readback``, device-path digests are not read now: they come back as
    `Deferred` values that the readback fills in later (see `producers.readback`).
    """
    results: list[Any] = [None] * len(tensors)
    pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for index, tensor in enumerate(tensors):
        if tensor is None or skip_reason(tensor) is not None:
            continue
        use_device_path = not tensor.is_cpu if on_device is None else on_device
        if use_device_path:
            pending.append((index, tensor, device_digest_words(tensor)))
        else:
            results[index] = cpu_digest(tensor)
    by_device: dict[torch.device, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for item in pending:
        by_device.setdefault(item[2].device, []).append(item)
    for group in by_device.values():
        stacked = torch.stack([words for _, _, words in group])
        if readback is not None:
            values = readback.digests(stacked, [_cached_header(tensor) for _, tensor, _ in group])
            for (index, _, _), value in zip(group, values):
                results[index] = value
            continue
        host_words = stacked.tolist()  # one sync per device
        for (index, tensor, _), words in zip(group, host_words):
            results[index] = format_device_digest(tensor, words)
    return results
