"""Read and validate split GGUF sets (llama.cpp's `<prefix>-NNNNN-of-MMMMM.gguf`) and plan a merge.

The header parser is struct-based and reads through an mmap, so only the header pages are touched.
It is stricter than gguf-py's GGUFReader in the ways llama.cpp's own reader (ggml/src/gguf.cpp) is:
version 2 or 3, little-endian, unique keys, u32 power-of-two `general.alignment`, tensor names
shorter than 64 bytes and free of NUL bytes (ggml names are C strings: llama.cpp cuts such a name
at the NUL, so two tensors could share it), at most 4 dimensions, rows a multiple of the type's
block size (with llama.cpp's implicit ne[0] = 1 for 0 dimensions, so a quantized tensor of 0
dimensions is refused as llama.cpp refuses it), and tensor offsets laid out contiguously at the
file's alignment. gguf-py supplies the format constants and
the ggml type sizes (GGML_QUANT_SIZES). GGUFReader itself was measured too slow for this job: on
benchmarks/bench_merge.py's 10 shards (1,800 tensors, a 154,880-token vocabulary) it took 20.8 s
where this parser took 0.09 s (61 s vs 0.29 s on a loaded machine); it builds numpy objects for
every field and every string. The tests use it as the independent reader of merged files.

Every problem raises ShardError(path, problem); str() gives `<path>: <problem>` on one line (names
from the file are quoted with repr(), so a newline in a tensor name or a path cannot split it).
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

# gguf-py's format constants and ggml type sizes. `import gguf` also loads numpy and gguf-py's
# reader/writer: measured 0.07 s of start-up (python -X importtime), nothing beside a merge of
# gigabytes, so the package is imported the ordinary way.
import gguf.constants as _C

GGML_QUANT_SIZES = _C.GGML_QUANT_SIZES
GGUF_DEFAULT_ALIGNMENT = _C.GGUF_DEFAULT_ALIGNMENT
GGUF_MAGIC = _C.GGUF_MAGIC
GGUFValueType = _C.GGUFValueType
Keys = _C.Keys

KEY_SPLIT_NO = Keys.Split.LLM_KV_SPLIT_NO  # u16, 0-based
KEY_SPLIT_COUNT = Keys.Split.LLM_KV_SPLIT_COUNT  # u16
KEY_SPLIT_TENSORS_COUNT = Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT  # i32, total over the set
KEY_ALIGNMENT = Keys.General.ALIGNMENT  # u32

OUTPUT_VERSION = 3  # llama.cpp writes GGUF_VERSION whatever the input's version was
GGML_MAX_NAME = 64  # ggml.h: names are char[64] including the NUL
GGML_MAX_DIMS = 4
# re.S: a newline is a legal character of a file name
SHARD_NAME_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf\Z", re.S)

_T = GGUFValueType
_SCALAR = {  # value type -> (struct format, size)
    _T.UINT8: ("<B", 1), _T.INT8: ("<b", 1), _T.UINT16: ("<H", 2), _T.INT16: ("<h", 2),
    _T.UINT32: ("<I", 4), _T.INT32: ("<i", 4), _T.FLOAT32: ("<f", 4), _T.BOOL: ("<B", 1),
    _T.UINT64: ("<Q", 8), _T.INT64: ("<q", 8), _T.FLOAT64: ("<d", 8),
}  # fmt: skip
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class ShardError(Exception):
    """A problem with one file of the set (or with the output path); str() is `path: problem`."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(one_line(f"{path}: {problem}"))
        self.path = Path(path)
        self.problem = problem


def one_line(text: str) -> str:
    """TEXT with control characters escaped (a path or name from a file may hold a newline)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def pad(n: int, alignment: int) -> int:
    """GGML_PAD: n rounded up to a multiple of alignment (a power of two)."""
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class KeyValue:
    key: str
    vtype: int  # GGUFValueType; ARRAY for arrays
    encoded: bytes  # the whole entry as llama.cpp writes it (key, type, value; bools as 0/1)
    value: int | float | str | None  # scalars only


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # GGUF order: ne[0] is the row (fastest) dimension, as stored
    ggml_type: int
    offset: int  # relative to the file's data section
    nbytes: int

    @property
    def n_dims(self) -> int:
        """ggml_n_dims(): trailing dimensions of 1 are dropped (llama.cpp writes it that way)."""
        ne = self.ne + (1,) * (GGML_MAX_DIMS - len(self.ne))
        for i in range(GGML_MAX_DIMS - 1, 0, -1):
            if ne[i] > 1:
                return i + 1
        return 1


@dataclass
class Header:
    path: Path
    version: int
    kvs: list[KeyValue]
    tensors: list[TensorInfo]
    alignment: int
    has_alignment_key: bool
    data_offset: int  # absolute file offset of the data section
    file_size: int
    dev_ino: tuple[int, int] = (0, 0)
    fd: int = -1  # the descriptor it was read through, when the caller keeps it open

    def kv(self, key: str) -> KeyValue | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    @property
    def data_end(self) -> int:
        if not self.tensors:
            return self.data_offset
        last = self.tensors[-1]
        return self.data_offset + last.offset + last.nbytes


class _Cursor:
    """Bounds-checked little-endian reads from the mapped header."""

    def __init__(self, path: Path, buf: mmap.mmap, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise ShardError(
                self.path,
                f"header truncated or corrupt: {what} needs {n} bytes at offset {start}, "
                f"file has {self.size}",
            )
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.buf, self.need(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.buf, self.need(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.need(n, what)
        return self.buf[start : start + n].decode("utf-8", errors="surrogateescape")

    def skip_strings(self, count: int, what: str) -> None:
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        try:  # the hot loop of a 150k-token vocabulary: no bounds check but unpack_from's own
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        except struct.error:
            self.pos = self.size
            self.need(8, what)
        if pos > self.size:
            self.pos = self.size
            self.need(pos - self.size, what)
        self.pos = pos


def open_shard(path: Path) -> int:
    """Open PATH read-only without blocking (a FIFO planted there cannot hang the open) and refuse
    anything that is not a regular file; returns the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ShardError(path, f"cannot open: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ShardError(path, "not a regular file")
    return fd


def read_header(path: Path, fd: int | None = None) -> Header:
    """Parse and check one GGUF file's header; raises ShardError naming the file and the problem.

    With FD (from open_shard) the header is read through it and FD stays open: the caller copies
    from the very file that was validated, whatever happens to PATH meanwhile.
    """
    own = fd is None
    if fd is None:
        fd = open_shard(path)
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size < 24:
            raise ShardError(path, f"not a GGUF file: {size} bytes, shorter than a GGUF header")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            header = _parse(path, buf, size)
    finally:
        if own:
            os.close(fd)
    header.dev_ino = (st.st_dev, st.st_ino)
    header.fd = -1 if own else fd
    return header


def _claim(path: Path, name: str, seen: set[str], what: str, dup: str) -> None:
    """NAME is new in SEEN and has no NUL byte (a C reader would cut it there)."""
    if "\0" in name:
        raise ShardError(path, f"{what} {name!r} contains a NUL byte")
    if name in seen:
        raise ShardError(path, f"duplicate {dup} {name!r}")
    seen.add(name)


def _parse(path: Path, buf: mmap.mmap, size: int) -> Header:
    cur = _Cursor(path, buf, size)
    magic = cur.u32("magic")
    if magic != GGUF_MAGIC:
        raise ShardError(path, f"not a GGUF file: magic {buf[0:4]!r}, expected b'GGUF'")
    version = cur.u32("version")
    if version & 0xFFFF == 0 and version != 0:
        raise ShardError(path, "big-endian GGUF (byte-swapped version) is not supported")
    if version not in (2, 3):
        raise ShardError(path, f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("key/value count")
    # every KV takes >= 12 bytes and every tensor info >= 24: reject absurd counts before looping
    if n_kv * 12 + n_tensors * 24 > size:
        raise ShardError(
            path,
            f"header truncated or corrupt: {n_kv} key/values and {n_tensors} tensors cannot fit in "
            f"{size} bytes",
        )

    kvs: list[KeyValue] = []
    seen: set[str] = set()
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"key {i}")
        if not key:
            raise ShardError(path, f"key/value {i} has an empty key")
        _claim(path, key, seen, "key", "key")
        vtype = cur.u32(f"type of {key!r}")
        value: int | float | str | None = None
        if vtype == _T.ARRAY:
            sub = cur.u32(f"array type of {key!r}")
            count = cur.u64(f"array length of {key!r}")
            if sub == _T.STRING:
                cur.skip_strings(count, f"array {key!r}")
            elif sub in _SCALAR:
                cur.need(count * _SCALAR[sub][1], f"array {key!r}")
            else:
                raise ShardError(path, f"key {key!r} has an array of invalid type {sub}")
            encoded = bytes(buf[start : cur.pos])
            if sub == _T.BOOL:  # llama.cpp reads bools as `byte != 0` and writes 0/1
                body = len(encoded) - count
                encoded = encoded[:body] + bytes(b != 0 for b in encoded[body:])
        elif vtype == _T.STRING:
            value = cur.string(f"value of {key!r}")
            encoded = bytes(buf[start : cur.pos])
        elif vtype in _SCALAR:
            fmt, n = _SCALAR[vtype]
            value = struct.unpack_from(fmt, buf, cur.need(n, f"value of {key!r}"))[0]
            if vtype == _T.BOOL:
                value = int(value != 0)
                encoded = bytes(buf[start : cur.pos - 1]) + bytes([value])
            else:
                encoded = bytes(buf[start : cur.pos])
        else:
            raise ShardError(path, f"key {key!r} has invalid type {vtype}")
        kvs.append(KeyValue(key, vtype, encoded, value))

    alignment = GGUF_DEFAULT_ALIGNMENT
    align_kv = next((kv for kv in kvs if kv.key == KEY_ALIGNMENT), None)
    if align_kv is not None:
        if align_kv.vtype != _T.UINT32:
            raise ShardError(path, f"{KEY_ALIGNMENT} must be u32, is {_type_name(align_kv.vtype)}")
        alignment = int(align_kv.value)  # type: ignore[arg-type]
        if alignment == 0 or alignment & (alignment - 1):
            raise ShardError(path, f"{KEY_ALIGNMENT} is {alignment}, not a power of two")

    tensors: list[TensorInfo] = []
    names: set[str] = set()
    expected = 0
    for i in range(n_tensors):
        name = cur.string(f"name of tensor {i}")
        if len(name.encode("utf-8", errors="surrogateescape")) >= GGML_MAX_NAME:
            raise ShardError(path, f"tensor name {name!r} is {len(name)} bytes, limit is 63")
        _claim(path, name, names, "tensor name", "tensor")
        n_dims = cur.u32(f"dimensions of {name!r}")
        if n_dims > GGML_MAX_DIMS:
            raise ShardError(path, f"tensor {name!r} has {n_dims} dimensions, at most 4 allowed")
        ne = struct.unpack_from(f"<{n_dims}q", buf, cur.need(8 * n_dims, f"shape of {name!r}"))
        if any(d < 0 for d in ne):
            raise ShardError(path, f"tensor {name!r} has a negative dimension {ne}")
        ggml_type = cur.u32(f"type of {name!r}")
        offset = cur.u64(f"offset of {name!r}")
        sizes = GGML_QUANT_SIZES.get(ggml_type)  # type: ignore[call-overload]
        if sizes is None:
            raise ShardError(path, f"tensor {name!r} has unknown ggml type {ggml_type}")
        block, type_size = sizes
        row = ne[0] if ne else 1  # llama.cpp fills missing dimensions with 1
        if row % block:
            raise ShardError(
                path,
                f"tensor {name!r} rows of {row} are not a multiple of the block size {block}"
                + (" (0 dimensions: a row of 1 element)" if not ne else ""),
            )
        nelem = 1
        for d in ne:
            nelem *= d
        nbytes = nelem // block * type_size
        if offset != expected:
            raise ShardError(
                path,
                f"tensor {name!r} has data offset {offset}, expected {expected} "
                f"(tensor data must be contiguous at alignment {alignment})",
            )
        expected += pad(nbytes, alignment)
        tensors.append(TensorInfo(name, tuple(ne), ggml_type, offset, nbytes))

    data_offset = pad(cur.pos, alignment) if tensors else cur.pos
    header = Header(path, version, kvs, tensors, alignment, align_kv is not None, data_offset, size)
    if header.data_end > size:
        first = next(t for t in tensors if data_offset + t.offset + t.nbytes > size)
        raise ShardError(
            path,
            f"truncated: tensor data ends at byte {header.data_end} but the file has {size} bytes "
            f"(tensor {first.name!r} is incomplete)",
        )
    return header


def _type_name(vtype: int) -> str:
    try:
        return GGUFValueType(vtype).name.lower()
    except ValueError:
        return f"type {vtype}"


def split_path(prefix: str, index: int, count: int) -> str:
    """llama_split_path(): the file name of shard `index` (0-based) of `count`."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def find_shards(shard: Path) -> list[Path]:
    """All files of the set `shard` belongs to, in order; raises ShardError if one is missing."""
    m = SHARD_NAME_RE.match(shard.name)
    if not m:
        raise ShardError(shard, "file name does not match <prefix>-NNNNN-of-MMMMM.gguf")
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count:
        raise ShardError(shard, f"file name says shard {no} of {count}")
    if not shard.is_file():
        raise ShardError(shard, "no such file" if not shard.exists() else "not a regular file")
    paths = [shard.with_name(split_path(m["prefix"], i, count)) for i in range(count)]
    for i, p in enumerate(paths):
        if not p.is_file():
            if p.exists():  # a FIFO or device planted in the set: never opened
                raise ShardError(p, f"shard {i + 1} of {count} is not a regular file")
            raise ShardError(p, f"missing shard {i + 1} of {count}")
    return paths


@dataclass
class Copy:
    """One tensor's bytes: src_offset in the shard, dst_offset in the output, then zero padding."""

    src_offset: int
    dst_offset: int
    nbytes: int
    padding: int


@dataclass
class ShardPlan:
    path: Path
    copies: list[Copy] = field(default_factory=list)
    fd: int = -1  # the validated file's descriptor (Header.fd)
    identity: tuple[int, int, int] = (0, 0, 0)  # (st_dev, st_ino, st_size) when validated

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes + c.padding for c in self.copies)


@dataclass
class MergePlan:
    shards: list[ShardPlan]
    header: bytes  # the output's header, padded to its alignment
    alignment: int
    n_tensors: int
    total_size: int

    @property
    def data_bytes(self) -> int:
        return self.total_size - len(self.header)


def read_set(paths: list[Path], fds: list[int] | None = None) -> list[Header]:
    """Parse every shard and check the split keys, the file names and the tensor names.

    FDS (one per path, from open_shard) are read through and left open for the caller.
    """
    count = len(paths)
    if fds is None:
        headers = [read_header(p) for p in paths]
    else:
        headers = [read_header(p, fd) for p, fd in zip(paths, fds, strict=True)]
    total = sum(len(h.tensors) for h in headers)
    first_of: dict[tuple[int, int], int] = {}
    owner: dict[str, int] = {}
    tensors_count = None
    for i, h in enumerate(headers):
        p = h.path
        if h.dev_ino in first_of:
            j = first_of[h.dev_ino]
            raise ShardError(p, f"duplicate shard: same file as shard {j + 1} ({paths[j]})")
        first_of[h.dev_ino] = i
        no = _split_key(h, KEY_SPLIT_NO, _T.UINT16)
        if no != i:
            raise ShardError(
                p,
                f"{KEY_SPLIT_NO} is {no} (shard {no + 1}) but the file name says shard {i + 1} "
                f"of {count}" + (": a duplicate shard?" if no < count else ""),
            )
        n = _split_key(h, KEY_SPLIT_COUNT, _T.UINT16)
        if n != count:
            raise ShardError(p, f"{KEY_SPLIT_COUNT} is {n} but the file name says {count} shards")
        tc = _split_key(h, KEY_SPLIT_TENSORS_COUNT, _T.INT32)
        if tensors_count is None:
            tensors_count = tc
        elif tc != tensors_count:
            raise ShardError(
                p, f"{KEY_SPLIT_TENSORS_COUNT} is {tc} but shard 1 says {tensors_count}"
            )
        if i and not h.has_alignment_key and headers[0].alignment != GGUF_DEFAULT_ALIGNMENT:
            raise ShardError(
                p,
                f"no {KEY_ALIGNMENT} while shard 1 declares {headers[0].alignment}: this shard's "
                f"data layout is ambiguous (read at {GGUF_DEFAULT_ALIGNMENT}, as llama.cpp does)",
            )
        for t in h.tensors:
            if t.name in owner:
                j = owner[t.name]
                raise ShardError(
                    p, f"duplicate tensor {t.name!r}: also in shard {j + 1} ({paths[j]})"
                )
            owner[t.name] = i
    if tensors_count != total:
        raise ShardError(
            paths[0],
            f"{KEY_SPLIT_TENSORS_COUNT} is {tensors_count} but the {count} shards hold {total} "
            "tensors",
        )
    return headers


def _split_key(h: Header, key: str, vtype: GGUFValueType) -> int:
    kv = h.kv(key)
    if kv is None:
        raise ShardError(h.path, f"no {key} key: not a shard of a split set")
    if kv.vtype != vtype:
        raise ShardError(h.path, f"{key} is {_type_name(kv.vtype)}, expected {vtype.name.lower()}")
    return int(kv.value)  # type: ignore[arg-type]


def encode_string(s: str) -> bytes:
    b = s.encode("utf-8", errors="surrogateescape")
    return _U64.pack(len(b)) + b


def plan_merge(headers: list[Header]) -> MergePlan:
    """Lay out the merged file exactly as llama-gguf-split --merge does, at shard 1's alignment.

    Shard 1's key/values in order, except split.count, which llama.cpp sets to 0 with
    gguf_set_val_u16() (remove, then append) so it ends the list; tensor infos in shard order with
    ggml_n_dims() dimensions; offsets re-laid at the alignment; every tensor zero-padded.
    """
    first = headers[0]
    alignment = first.alignment
    kvs = [kv.encoded for kv in first.kvs if kv.key != KEY_SPLIT_COUNT]
    kvs.append(encode_string(KEY_SPLIT_COUNT) + _U32.pack(_T.UINT16) + struct.pack("<H", 0))
    infos: list[bytes] = []
    offset = 0
    layout: list[tuple[TensorInfo, int]] = []
    for h in headers:
        for t in h.tensors:
            n_dims = t.n_dims
            ne = t.ne + (1,) * (n_dims - len(t.ne))
            infos.append(
                encode_string(t.name)
                + _U32.pack(n_dims)
                + struct.pack(f"<{n_dims}q", *ne[:n_dims])
                + _U32.pack(t.ggml_type)
                + _U64.pack(offset)
            )
            layout.append((t, offset))
            offset += pad(t.nbytes, alignment)
    n_tensors = len(infos)
    head = (
        _U32.pack(GGUF_MAGIC)
        + _U32.pack(OUTPUT_VERSION)
        + _U64.pack(n_tensors)
        + _U64.pack(len(kvs))
        + b"".join(kvs)
        + b"".join(infos)
    )
    head += bytes(pad(len(head), alignment) - len(head))
    data_offset = len(head)
    shards: list[ShardPlan] = []
    it = iter(layout)
    for h in headers:
        sp = ShardPlan(h.path, fd=h.fd, identity=(*h.dev_ino, h.file_size))
        for t in h.tensors:
            _, out_off = next(it)
            sp.copies.append(
                Copy(
                    h.data_offset + t.offset,
                    data_offset + out_off,
                    t.nbytes,
                    pad(t.nbytes, alignment) - t.nbytes,
                )
            )
        shards.append(sp)
    return MergePlan(shards, head, alignment, n_tensors, data_offset + offset)
