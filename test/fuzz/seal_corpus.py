#!/usr/bin/env python3
"""Re-seals the fuzz seeds that carry a format version and checksums.

When the wire version or the checkpoint format changes, the seeds in
test/fuzz/corpus/{wire_message,ps_server,checkpoint} must carry the new
number and CRCs again, or every seed is refused at the version check and the
replay (ctest fuzz/<name>) no longer reaches the code behind it. This script
writes the versions this tree's headers define into every frame and file,
and recomputes each CRC-32C:

  test/fuzz/seal_corpus.py            # re-seal in place; prints the files it changed
  test/fuzz/seal_corpus.py --check    # change nothing; exit 1 naming each stale frame

The numbers come from include/ashl/wire/header.hpp (`version`) and
include/ashl/ps/checkpoint.hpp (`checkpoint_format`). A change of layout
(a field moved, a body grown) still needs the seeds rewritten by hand, as in
43c04b9; this script only re-seals. ctest wire/corpus_sealed checks the same
thing with the library's own decoder, so a forgotten re-seal fails the suite.

Layouts (docs/wire-format.md, docs/checkpoints.md, test/fuzz/ps_server.cpp):
  wire_message/*  one frame: a 72-byte header (u16 version at 4, u32 CRC at 68
                  over bytes 0..67 and the payload), then the payload
  ps_server/*     a prefix byte, then per message: u8 header length, u16 data
                  length (little-endian), the header, the payload
  checkpoint/*    a 64-byte header (u32 format at 8, u32 state CRC at 56, u32
                  header CRC at 60 over bytes 0..59), then the state
"""
import argparse
import os
import re
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "test", "fuzz", "corpus")

WIRE_MAGIC = 0x4C485341
WIRE_HEADER = 72
WIRE_CRC_AT = 68
CKPT_MAGIC = b"ASHLCKPT"
CKPT_HEADER = 64


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _table()


def crc32c(data, crc=0):
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def constant(header, name):
    with open(os.path.join(ROOT, header)) as f:
        m = re.search(r"inline constexpr std::uint\d+_t " + name + r" = (\d+);", f.read())
    if not m:
        sys.exit(f"seal_corpus: {header}: no `inline constexpr ... {name} = N;`")
    return int(m.group(1))


def seal_frame(head, payload, version, where, stale):
    """The frame's header with `version` and its CRC; `where` names it in `stale`."""
    head = bytearray(head)
    if len(head) != WIRE_HEADER:
        stale.append(f"{where}: header of {len(head)} bytes, not {WIRE_HEADER} (rewrite it by hand)")
        return bytes(head)
    magic, v = struct.unpack_from("<IH", head, 0)
    if magic != WIRE_MAGIC:
        stale.append(f"{where}: magic 0x{magic:08X}, not 0x{WIRE_MAGIC:08X} (rewrite it by hand)")
        return bytes(head)
    if v != version:
        stale.append(f"{where}: version {v}, this tree's is {version}")
        struct.pack_into("<H", head, 4, version)
    crc = crc32c(payload, crc32c(head[:WIRE_CRC_AT]))
    if struct.unpack_from("<I", head, WIRE_CRC_AT)[0] != crc:
        stale.append(f"{where}: CRC 0x{struct.unpack_from('<I', head, WIRE_CRC_AT)[0]:08X}, "
                     f"its bytes give 0x{crc:08X}")
        struct.pack_into("<I", head, WIRE_CRC_AT, crc)
    return bytes(head)


def seal_wire_message(data, version, where, stale):
    return seal_frame(data[:WIRE_HEADER], data[WIRE_HEADER:], version, where, stale) + data[WIRE_HEADER:]


def seal_ps_server(data, version, where, stale):
    out = bytearray(data[:1])
    i, n = 1, 0
    while i + 3 <= len(data):
        hl = data[i]
        dl = data[i + 1] | data[i + 2] << 8
        if i + 3 + hl + dl > len(data):
            stale.append(f"{where}: message {n} runs past the end of the file (rewrite it by hand)")
            return bytes(data)
        head = data[i + 3:i + 3 + hl]
        payload = data[i + 3 + hl:i + 3 + hl + dl]
        out += data[i:i + 3] + seal_frame(head, payload, version, f"{where} message {n}", stale) + payload
        i += 3 + hl + dl
        n += 1
    if i != len(data):
        stale.append(f"{where}: {len(data) - i} bytes after message {n - 1} (rewrite it by hand)")
        return bytes(data)
    return bytes(out)


def seal_checkpoint(data, fmt, where, stale):
    head = bytearray(data[:CKPT_HEADER])
    if len(head) != CKPT_HEADER or head[:8] != CKPT_MAGIC:
        stale.append(f"{where}: not a checkpoint header (rewrite it by hand)")
        return bytes(data)
    state = data[CKPT_HEADER:]
    if struct.unpack_from("<I", head, 8)[0] != fmt:
        stale.append(f"{where}: format {struct.unpack_from('<I', head, 8)[0]}, this tree's is {fmt}")
        struct.pack_into("<I", head, 8, fmt)
    if struct.unpack_from("<Q", head, 48)[0] != len(state):
        stale.append(f"{where}: state_bytes {struct.unpack_from('<Q', head, 48)[0]}, the file holds {len(state)}")
        struct.pack_into("<Q", head, 48, len(state))
    # The state's CRC first: the header's covers it.
    for at, what, covered in ((56, "state", state), (60, "header", None)):
        crc = crc32c(covered if covered is not None else head[:60])
        if struct.unpack_from("<I", head, at)[0] != crc:
            stale.append(f"{where}: {what} CRC 0x{struct.unpack_from('<I', head, at)[0]:08X}, its bytes give 0x{crc:08X}")
            struct.pack_into("<I", head, at, crc)
    return bytes(head) + state


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a seed is stale")
    ap.add_argument("--corpus", default=CORPUS, help="the corpus directory (default: %(default)s)")
    a = ap.parse_args(argv)
    version = constant("include/ashl/wire/header.hpp", "version")
    fmt = constant("include/ashl/ps/checkpoint.hpp", "checkpoint_format")
    sealers = {"wire_message": lambda d, w, s: seal_wire_message(d, version, w, s),
               "ps_server": lambda d, w, s: seal_ps_server(d, version, w, s),
               "checkpoint": lambda d, w, s: seal_checkpoint(d, fmt, w, s)}
    stale, changed, seen = [], [], 0
    for target, seal in sealers.items():
        folder = os.path.join(a.corpus, target)
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                data = f.read()
            seen += 1
            sealed = seal(data, f"{target}/{name}", stale)
            if sealed != data:
                changed.append(f"{target}/{name}")
                if not a.check:
                    with open(path, "wb") as f:
                        f.write(sealed)
    for s in stale:
        print(s)
    verb = "stale" if a.check else "re-sealed"
    print(f"seal_corpus: {seen} seeds (wire version {version}, checkpoint format {fmt}); "
          f"{len(changed)} {verb}" + (": " + ", ".join(changed) if changed else ""))
    manual = [s for s in stale if "by hand" in s]
    return 1 if (a.check and stale) or manual else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
