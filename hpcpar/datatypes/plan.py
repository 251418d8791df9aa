"""``Plan``: one canonical layout, from an MPI datatype, a numpy view or a numpy dtype.

``plan.pack(src)`` and ``plan.unpack(buf, dst)`` move the data with strided numpy copies
(``kernels.py``); ``plan.to_mpi()`` gives an equivalent MPI datatype for zero-copy sends;
``plan.describe()`` prints the layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from mpi4py import MPI

from .blocks import block_op, blocks_of, worth_blocks
from .decode import decode_layout
from .errors import DatatypeError
from .ir import Item, Repeat, Strided, canonical, packed_size, replicate, span
from .kernels import (
    assignment,
    copy_kernels,
    flatten,
    replay,
    run_copies,
    user_view,
)
from .mpitype import mpi_items
from .views import pack_view, pack_view_anew, unpack_view, unpack_view_once

__all__ = ["Plan", "plan"]

_MAX_COUNT = 1 << 40
_BYTE = np.dtype(np.uint8)


_NOTHING = object()
_FORGOTTEN = (_NOTHING, _NOTHING, -1, -1, None, None, None, None)


class _Last:
    """A plan's last pack and unpack, each a tuple of eight.

    (src or buf, out or dst, count, origin, the copy, the packed bytes, and the copy's
    destination and source where it is one ``dst[...] = src``, else None twice.)
    Attributes of a slotted object, not a dict: ``pack`` of the same buffers again reads
    them faster, which matters on the smallest packs.
    """

    __slots__ = ("pack", "unpack")

    def __init__(self) -> None:
        self.pack: tuple[Any, ...] = _FORGOTTEN
        self.unpack: tuple[Any, ...] = _FORGOTTEN


@dataclass(frozen=True)
class Plan:
    """A canonical layout of one element, and how elements repeat.

    Attributes:
        items: The layout (``Strided`` and ``Repeat`` items, in pack order).
        lb: Lower bound: where the element starts, relative to its origin.
        extent: Distance between consecutive elements.
        source: What it was made from, for ``describe``.
        view_dtype: For plans of numpy views: the element dtype and shape.
    """

    items: tuple[Item, ...]
    lb: int
    extent: int
    source: str = ""
    view_shape: tuple[int, ...] | None = None
    view_dtype: Any = None
    # what is derived from the layout (kernels, bounds): shared by the plans that
    # ``plan()`` returns for the same layout
    _memo: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    # the buffers of this plan's last pack and unpack (``packer``), never shared
    _last: _Last = field(default_factory=_Last, compare=False, hash=False, repr=False)

    @property
    def size(self) -> int:
        """Bytes one element packs to."""
        size = self._memo.get("size")
        if size is None:
            size = self._memo["size"] = packed_size(self.items)
        return size

    @property
    def nbytes(self) -> int:
        """Bytes one element packs to (the same as ``size``)."""
        return self.size

    @property
    def true_bounds(self) -> tuple[int, int]:
        """(lowest byte touched, one past the highest), relative to the origin."""
        return span(self.items)

    def _check(self, count: int) -> None:
        if (
            isinstance(count, bool)
            or not isinstance(count, (int, np.integer))
            or not 0 <= count <= _MAX_COUNT
        ):
            raise DatatypeError(f"count must be an integer in 0..2**40, not {count!r}")

    def _reach(self, count: int) -> tuple[int, int]:
        key = ("reach", count)
        if key not in self._memo:
            self._memo[key] = _reach_of(self.items, self.extent, count)
        return self._memo[key]

    def _kernels(self, count: int) -> list[Any]:
        key = ("kernels", count)
        if key not in self._memo:
            self._memo[key] = _kernels_of(self.items, self.extent, count)
        return self._memo[key]

    def pack(self, src: Any, out: Any = None, *, count: int = 1, origin: int = 0) -> np.ndarray:
        """Pack ``count`` elements of ``src`` into contiguous bytes.

        Args:
            src: The data: a numpy array (any layout, for view plans the view itself)
                or any buffer; its byte ``origin`` is the element's origin.
            out: A writable uint8 buffer of at least ``count * size`` bytes, or None.
            count: Elements to pack.
            origin: Byte of ``src`` where the first element's origin lies.

        Returns:
            The packed bytes (a uint8 array; ``out``'s first bytes when given).

        Raises:
            DatatypeError: bad count, ``src`` too small for the elements, ``out`` too
                small or read-only.
        """
        if out is None:
            if (
                self.view_shape is not None
                and count == 1
                and origin == 0
                and isinstance(src, np.ndarray)
            ):
                return pack_view_anew(self, src)  # a new buffer in the view's own type
        else:
            last_src, last_out, last_count, last_origin, again, packed, into, copied = (
                self._last.pack
            )
            if (
                last_src is src
                and last_out is out
                and last_count == count
                and last_origin == origin
            ):
                # the same buffers as the previous call: every check and copy still holds
                if into is None:
                    again()
                else:
                    into[...] = copied
                return packed
        self._check(count)
        need = self.size * count
        view = self.view_shape is not None and origin == 0 and count == 1
        view = view and isinstance(src, np.ndarray)
        if not view:
            area = bytes_of(src, "src", writable=False)
            self._bounds(area, origin, count, "src")
            user = self._as_view(area, src, origin, count) if out is None else None
            if user is not None:  # into a new buffer, as that view would be
                return shared_plan(user).pack(user)
        packed = _out_buffer(out, need)
        if view:
            ops = pack_view(self, src, packed)
        else:
            keys = (src, out) if out is not None else None  # a new buffer: copied once
            ops = self._copy(area, packed, origin, count, pack=True, keys=keys)
        if out is not None:  # remember the buffers: a loop packing them again skips the checks
            again = replay(ops)
            self._last.pack = (src, out, count, origin, again, packed, *assignment(again))
        return packed

    def packer(self, src: Any, out: Any, *, count: int = 1, origin: int = 0) -> Any:
        """The persistent form of ``pack``: a function of no arguments that packs again.

        Checks and packs once, like ``pack(src, out, ...)``; each call of the result then
        repeats the same copies with no checks and no lookups (in the manner of MPI's
        persistent requests), for loops that pack the same buffers every step; on small
        layouts it runs faster than ``pack`` and numpy's copy (``hpcpar bench
        datatypes``, its packer variants). It holds ``src`` and ``out`` alive.
        """
        if out is None:
            raise DatatypeError("packer needs an out buffer to pack into")
        self.pack(src, out, count=count, origin=origin)
        return self._last.pack[4]

    def unpacker(self, buf: Any, dst: Any, *, count: int = 1, origin: int = 0) -> Any:
        """The persistent form of ``unpack`` (see ``packer``); holds ``buf`` and ``dst``."""
        self.unpack(buf, dst, count=count, origin=origin)
        return self._last.unpack[4]

    def unpack(self, buf: Any, dst: Any, *, count: int = 1, origin: int = 0) -> Any:
        """Scatter packed bytes into ``count`` elements of ``dst`` (the inverse of ``pack``).

        Raises:
            DatatypeError: bad count, ``buf`` too short, ``dst`` too small, read-only,
                or overlapping ``buf``.
        """
        return self._unpack(buf, dst, count, origin, remember=True)

    def _unpack(self, buf: Any, dst: Any, count: int, origin: int, remember: bool) -> Any:
        """``unpack``; ``remember=False`` for a buffer used once (a message received)."""
        last_buf, last_dst, last_count, last_origin, again, _, into, copied = self._last.unpack
        if (
            last_buf is buf
            and last_dst is dst
            and last_count == count
            and last_origin == origin
            and (type(dst) is not np.ndarray or dst.flags.writeable)  # may have been cleared
        ):
            # the same buffers as the previous call: every check and copy still holds
            if into is None:
                again()
            else:
                into[...] = copied
            return dst
        self._check(count)
        need = self.size * count
        packed = bytes_of(buf, "buf", writable=False)
        if packed.size < need:
            raise DatatypeError(
                f"buf has {packed.size} bytes; unpacking {count} element(s) needs {need}"
            )
        if (
            self.view_shape is not None
            and origin == 0
            and count == 1
            and isinstance(dst, np.ndarray)
        ):
            ops = unpack_view(self, packed, dst, once=not remember)
        else:
            area = bytes_of(dst, "dst", writable=True)
            if np.may_share_memory(area, packed) and np.shares_memory(area, packed):
                raise DatatypeError("dst and buf overlap; unpack into separate memory")
            self._bounds(area, origin, count, "dst")
            user = self._as_view(area, dst, origin, count) if not remember else None
            if user is not None:  # a message received: copied once, as into that view
                typed = packed[:need].view(user.dtype).reshape(user.shape)
                unpack_view_once(shared_plan(user), typed, user)
                return dst
            keys = (dst, buf) if remember else None
            ops = self._copy(area, packed[:need], origin, count, pack=False, keys=keys)
        if remember:
            again = replay(ops)
            self._last.unpack = (buf, dst, count, origin, again, None, *assignment(again))
        return dst

    def _copy(
        self, area: np.ndarray, packed: np.ndarray, origin: int, count: int, pack: bool, keys: Any
    ) -> list[Any]:
        """Copy ``count`` elements between ``area`` and ``packed``; the copies made.

        Irregular layouts (many small kernels) take the block loop (``blocks.py``), the
        rest one strided copy per kernel (``kernels.copy_kernels``).
        """
        blocks = self._block_list()
        if blocks is None:
            return copy_kernels(self._kernels(count), area, packed, origin, pack=pack, keys=keys)
        op = block_op(blocks, area, packed, origin, count, self.extent, self._reach(count), pack)
        run_copies([op])
        return [op]

    def _as_view(self, area: np.ndarray, keep: Any, origin: int, count: int) -> Any:
        """``count`` elements in ``area`` as one strided numpy view, when one kernel is all.

        Packs into new buffers and unpacks of received messages then run as the view's
        plan would, one copy instead of the kernel's two views and choice; the view is
        kept per buffer (``user_view``).
        None for irregular layouts, single blocks, several kernels and zero strides.
        """
        if self._block_list() is not None:
            return None
        kernels = self._kernels(count)
        if len(kernels) != 1 or kernels[0].empty or not kernels[0].dims:
            return None
        if any(stride == 0 for _, stride, _ in kernels[0].dims):
            return None  # the same bytes again (a view refuses zero strides)
        return user_view(kernels[0], area, keep, origin)

    def _block_list(self) -> Any:
        """The element's ``blocks.Blocks`` when the layout is irregular (many small kernels)."""
        blocks = self._memo.get("blocks", False)
        if blocks is False:
            one = self._kernels(1)
            blocks = blocks_of(one) if worth_blocks(one, self.size) else None
            self._memo["blocks"] = blocks
        return blocks

    def _holds(self, nbytes: int, origin: int, count: int) -> bool:
        """Whether ``nbytes`` bytes with the origin at byte ``origin`` hold ``count`` elements."""
        lo, hi = self._reach(count)
        return lo == hi or (origin + lo >= 0 and origin + hi <= nbytes)

    def _bounds(self, area: np.ndarray, origin: int, count: int, name: str) -> None:
        if not self._holds(area.size, origin, count):
            lo, hi = self._reach(count)
            raise DatatypeError(
                f"{name} has {area.size} bytes; {count} element(s) with origin at byte {origin} "
                f"reach bytes {origin + lo}..{origin + hi}"
            )

    def to_mpi(self) -> MPI.Datatype:
        """An equivalent committed MPI datatype (the caller frees it)."""
        dt = mpi_items(self.items)
        resized = dt.Create_resized(self.lb, self.extent)
        dt.Free()
        return resized.Commit()

    def describe(self, limit: int | None = 40) -> str:
        """The layout as text: one line per item, dimensions outermost first.

        At most ``limit`` lines of items (None: all), then how many more there are: an
        irregular layout has thousands.
        """
        what = self.source or "a layout"
        lines = [f"plan of {what}: {self.size} bytes packed, lb {self.lb}, extent {self.extent}"]
        items = _describe(self.items, "  ")
        if limit is not None and len(items) > limit:
            blocks = self._block_list()
            many = f" ({blocks.at.size:,} blocks: copied by the block loop)" if blocks else ""
            items = [*items[:limit], f"  ... {len(items) - limit:,} more lines{many}"]
        return "\n".join(lines + items)


@lru_cache(maxsize=256)
def _kernels_of(items: tuple[Item, ...], extent: int, count: int) -> list[Any]:
    """The copy kernels of ``count`` elements, computed once per layout and count."""
    repeated = items if count == 1 else (Repeat(count, extent, items),)
    return flatten(canonical(repeated))


@lru_cache(maxsize=256)
def _reach_of(items: tuple[Item, ...], extent: int, count: int) -> tuple[int, int]:
    """Bytes ``count`` elements touch, relative to the first element's origin."""
    lo, hi = span(items)
    if count == 0 or lo == hi:
        return 0, 0
    last = (count - 1) * extent
    return lo + min(0, last), hi + max(0, last)


def _describe(items: tuple[Item, ...], indent: str) -> list[str]:
    out = []
    for item in items:
        if isinstance(item, Strided):
            dims = (
                " x ".join(f"{c}@{s}" for c, s in zip(item.counts, item.strides, strict=True))
                or "once"
            )
            out.append(f"{indent}block {item.size} B at {item.offset}, over {dims}")
        else:
            out.append(f"{indent}repeat {item.count} times every {item.stride} B:")
            out += _describe(item.body, indent + "  ")
    return out


def _out_buffer(out: Any, need: int) -> np.ndarray:
    if out is None:
        return np.empty(need, dtype=np.uint8)
    packed = bytes_of(out, "out", writable=True)
    if packed.size < need:
        raise DatatypeError(f"out has {packed.size} bytes; the packed data needs {need}")
    return packed[:need]


def bytes_of(obj: Any, name: str, writable: bool) -> np.ndarray:
    """A flat uint8 view of a contiguous buffer (or of a whole numpy array's memory)."""
    if isinstance(obj, np.ndarray):
        flags = obj.flags
        if obj.dtype is _BYTE and obj.ndim == 1 and flags.c_contiguous:
            if writable and not flags.writeable:
                raise DatatypeError(f"{name} is read-only")
            return obj
        if not (flags.c_contiguous or flags.f_contiguous):
            raise DatatypeError(
                f"{name} must be contiguous here (pass the whole array and an origin)"
            )
        if writable and not obj.flags.writeable:
            raise DatatypeError(f"{name} is read-only")
        return obj.reshape(-1, order="A").view(np.uint8)
    try:
        view = memoryview(obj)
    except TypeError:
        raise DatatypeError(
            f"{name} must be an array or a buffer, not {type(obj).__name__}"
        ) from None
    if writable and view.readonly:
        raise DatatypeError(f"{name} is read-only")
    return (
        np.frombuffer(view, dtype=np.uint8)
        if view.readonly
        else np.asarray(view).reshape(-1).view(np.uint8)
    )


def _view_items(
    shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
) -> tuple[Item, ...]:
    if any(s == 0 and n > 1 for s, n in zip(strides, shape, strict=True)):
        raise DatatypeError(
            "arrays with zero strides (broadcast views) have no plan: copy them first"
        )
    return canonical((Strided(0, itemsize, shape, strides),))


def _dtype_items(dtype: np.dtype, offset: int = 0) -> tuple[Item, ...]:
    if dtype.fields is None:
        if dtype.subdtype is not None:
            base, shape = dtype.subdtype
            return replicate_shape(_dtype_items(base, offset), shape, base.itemsize)
        return (Strided(offset, dtype.itemsize),)
    out: list[Item] = []
    for name in dtype.names or ():
        field, field_offset = dtype.fields[name][:2]
        out.extend(_dtype_items(field, offset + field_offset))
    return canonical(tuple(out))


def replicate_shape(
    items: tuple[Item, ...], shape: tuple[int, ...], itemsize: int
) -> tuple[Item, ...]:
    """A C-ordered block of ``shape`` elements of a layout ``itemsize`` bytes apart."""
    stride = itemsize
    for n in reversed(shape):
        items = replicate(items, n, stride)
        stride *= n
    return items


def plan(obj: Any, count: int = 1) -> Plan:
    """The plan of an MPI datatype, a numpy array view, or a numpy dtype.

    Each call returns a new ``Plan`` (its ``packer`` buffers are its own), but the
    layout is worked out once: a datatype's plans are cached on the datatype itself (an
    MPI attribute, dropped when the datatype is freed), a view's and a dtype's by their
    shape, strides and dtype. Decoding and canonicalising cost more than sending a small
    message, so no ``hpcpar.send`` of a non-contiguous view or datatype pays it twice.

    Args:
        obj: A committed ``MPI.Datatype``; a numpy array (its view: shape and strides,
            negative ones included; the plan packs what ``numpy.ascontiguousarray``
            gives); or a numpy dtype (structured dtypes skip their padding).
        count: With a datatype, a plan of ``count`` consecutive elements.

    Raises:
        DatatypeError: a null, freed or uncommitted datatype, a broadcast view, a bad
            count.
    """
    return _fresh(shared_plan(obj, count))


def shared_plan(obj: Any, count: int = 1) -> Plan:
    """``plan(obj, count)`` itself, shared by every caller (no copy of the plan).

    Only for callers that never call ``pack(..., out=...)``, ``unpack`` or ``packer``
    on it (they remember buffers), as ``hpcpar.send`` and ``recv`` do not.
    """
    if isinstance(obj, MPI.Datatype):
        if obj == MPI.DATATYPE_NULL:
            raise DatatypeError("datatype is MPI.DATATYPE_NULL (freed or never created)")
        return _datatype_plan(obj, count)
    if isinstance(obj, np.ndarray):
        key: Any = (obj.shape, obj.strides, obj.dtype)
    elif isinstance(obj, np.dtype):
        key = obj
    else:
        return _plan_of(obj, count)
    known = _LAYOUTS.get(key)
    if known is None:
        known = _plan_of(obj, count)
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = known
    return known


# Plans of views and dtypes by (shape, strides, dtype) or dtype: the first of each
# layout, which ``plan()`` copies (sharing what was derived from the layout)
_LAYOUTS: dict[Any, Plan] = {}
_LAYOUTS_MAX = 512
_PLANS_KEYVAL: list[int] = []  # the MPI attribute that holds a datatype's plans


def _fresh(known: Plan) -> Plan:
    """A new plan of ``known``'s layout: its derived kernels shared, no buffers remembered."""
    fresh = object.__new__(Plan)  # a frozen dataclass's __init__ costs several times this
    fresh.__dict__.update(known.__dict__)
    fresh.__dict__["_last"] = _Last()
    return fresh


def _datatype_plan(dt: MPI.Datatype, count: int) -> Plan:
    """``plan(dt, count)``, decoded once per datatype and count and kept on the datatype."""
    if not _PLANS_KEYVAL:
        _PLANS_KEYVAL.append(MPI.Datatype.Create_keyval())
    try:
        plans = dt.Get_attr(_PLANS_KEYVAL[0])
    except MPI.Exception:
        raise DatatypeError("datatype is not a valid handle (freed elsewhere?)") from None
    if plans is None:
        _check_committed(dt)
        plans = {}
        dt.Set_attr(_PLANS_KEYVAL[0], plans)
    known = plans.get(count) if isinstance(count, int) and not isinstance(count, bool) else None
    if known is None:
        known = _plan_of(dt, count)
        if len(plans) >= 16:
            plans.clear()
        plans[count] = known
    return known


def _check_committed(dt: MPI.Datatype) -> None:
    """Refuse an uncommitted datatype as MPI would (MPICH's ``Pack_size`` says so)."""
    if dt.is_predefined:
        return
    try:
        dt.Pack_size(1, MPI.COMM_SELF)
    except MPI.Exception as e:
        if e.Get_error_class() == MPI.ERR_TYPE:
            raise DatatypeError(
                "datatype is not committed: call its Commit() before using it"
            ) from None
        raise


def _plan_of(obj: Any, count: int) -> Plan:
    """Work out the plan (no caching)."""
    if isinstance(obj, MPI.Datatype):
        lb, extent = obj.Get_extent()
        items = decode_layout(obj)
        name = obj.Get_name() or obj.decode()[1].lower()
        if count != 1:
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise DatatypeError(f"count must be an integer >= 0, not {count!r}")
            items = canonical((Repeat(count, extent, items),)) if count else ()
            extent *= count
        return Plan(items, lb, extent, f"MPI datatype {name}")
    if isinstance(obj, np.dtype) or (isinstance(obj, type) and issubclass(obj, np.generic)):
        dtype = np.dtype(obj)
        return Plan(_dtype_items(dtype), 0, dtype.itemsize, f"numpy dtype {dtype}")
    if isinstance(obj, np.ndarray):
        items = _view_items(tuple(obj.shape), tuple(obj.strides), obj.itemsize)
        lo, hi = span(items)
        return Plan(
            items, lo, hi - lo, f"numpy view {obj.shape} {obj.dtype}", tuple(obj.shape), obj.dtype
        )
    if hasattr(obj, "__cuda_array_interface__"):
        iface = obj.__cuda_array_interface__
        itemsize = np.dtype(iface["typestr"]).itemsize
        strides = iface.get("strides") or tuple(
            itemsize * int(np.prod(iface["shape"][i + 1 :])) for i in range(len(iface["shape"]))
        )
        items = _view_items(tuple(iface["shape"]), tuple(strides), itemsize)
        lo, hi = span(items)
        return Plan(
            items,
            lo,
            hi - lo,
            f"device view {tuple(iface['shape'])}",
            tuple(iface["shape"]),
            np.dtype(iface["typestr"]),
        )
    raise DatatypeError(
        f"cannot make a plan of {type(obj).__name__}: pass an MPI datatype, array or dtype"
    )
