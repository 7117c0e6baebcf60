"""Writes the seed corpora in tests/native/fuzz/corpus/<target>/ (checked in; rerun after a wire change).

The layouts are described at the top of each fuzz_*.cc; the communicator identity
is fuzz_common.h's kCommId / kToken.
"""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
COMM_ID = 0x0123456789ABCDEF
TOKEN = bytes([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF])

WIRE_MAGIC, WIRE_VERSION, HELLO_MAGIC = 0x4C4F4352, 3, 0x53484352
# fuzz_receive_path.cc's kKinds order -> OpKind values
KINDS = ["allreduce", "allgather", "broadcast", "reduce_scatter", "barrier", "reduce", "gather", "scatter",
         "alltoall", "p2p"]
OP_KIND = {"allreduce": 1, "allgather": 2, "broadcast": 3, "reduce_scatter": 4, "barrier": 5, "reduce": 6,
           "gather": 7, "scatter": 8, "alltoall": 9, "p2p": 10}
ABORT = 100
ELEMENT_SIZE = [2, 2, 4, 8, 1, 1, 4, 8, 1]  # DataType 0..8
MISMATCH = 3  # ErrorKind::kMismatch


def header(kind, dtype=2, reduce_op=0, root=0, seq=1, count=0, offset=0, nbytes=None, src=1, error_kind=0,
           comm_id=COMM_ID, magic=WIRE_MAGIC):
    k = OP_KIND.get(kind, kind)
    if nbytes is None:
        nbytes = count * ELEMENT_SIZE[dtype]
    if k not in (1, 4, 6):
        reduce_op = 0
    if k not in (3, 6, 7, 8, 10):
        root = 0
    return struct.pack("<IHBBBBHIIQQQQQI", magic, WIRE_VERSION, k, dtype, reduce_op, error_kind, 0, src, root,
                       comm_id, seq, count, offset, nbytes, 0)


def recv_cfg(kind, dtype=2, reduce_op=0, root=0, count=0):
    """The 3 bytes fuzz_receive_path.cc turns into an expected header."""
    return bytes([KINDS.index(kind) + 10 * reduce_op, dtype + 9 * root, count])


def message(kind, seq, dtype=2, reduce_op=0, root=0, count=0, fill=0x41):
    return header(kind, dtype, reduce_op, root, seq, count) + bytes([fill]) * (count * ELEMENT_SIZE[dtype])


def abort_message(text, error_kind=MISMATCH):
    data = text.encode()
    return header(ABORT, dtype=0, nbytes=len(data), error_kind=error_kind, src=1) + data


def hello(src=1, dst=0, is_ack=0, comm_id=COMM_ID, token=TOKEN, lane=0, lanes=1):
    return struct.pack("<IHHIIQ16sHH", HELLO_MAGIC, WIRE_VERSION, is_ack, src, dst, comm_id, token, lane, lanes)


def receive_path():
    f32, i64, u8 = 2, 7, 5
    two = recv_cfg("allreduce", f32, 0, 0, 4) + recv_cfg("allreduce", f32, 0, 0, 2)
    return {
        # 1 early receive + the probe, both satisfied, then EOF
        "two_messages": bytes([0x01]) + two + message("allreduce", 1, f32, count=4)
        + message("allreduce", 2, f32, count=2),
        # the same, written one byte at a time, receives posted halfway
        "two_messages_bytewise": bytes([0x01 | 0x04 | 0x40]) + two + message("allreduce", 1, f32, count=4)
        + message("allreduce", 2, f32, count=2),
        # nothing posted early: the abort is read eagerly; the probe fails with its text
        "abort_eager": bytes([0x00 | 0x10]) + recv_cfg("broadcast", u8, 0, 1, 8)
        + abort_message("rank 1 called allreduce(float32, count=1001, op=sum) as op #1 while rank 0 called "
                        "allreduce(float32, count=1000, op=sum) as op #1"),
        # a message, then an abort while the second receive waits
        "message_then_abort": bytes([0x02 | 0x08]) + recv_cfg("broadcast", i64, 0, 1, 3)
        + recv_cfg("broadcast", i64, 0, 1, 3) + recv_cfg("barrier", u8)
        + message("broadcast", 1, i64, root=1, count=3) + abort_message("killed", error_kind=2),
        # count mismatch
        "count_mismatch": bytes([0x01]) + recv_cfg("allreduce", f32, 0, 0, 4) + recv_cfg("barrier", u8)
        + message("allreduce", 1, f32, count=5),
        # payload cut short by EOF
        "truncated_payload": bytes([0x01 | 0x80]) + recv_cfg("gather", f32, 0, 1, 16) + recv_cfg("barrier", u8)
        + message("gather", 1, f32, root=1, count=16)[:64 + 30],
        # three receives of different kinds, one released while pending
        "three_kinds": bytes([0x03 | 0x20]) + recv_cfg("reduce", f32, 4, 1, 2) + recv_cfg("alltoall", u8, 0, 0, 5)
        + recv_cfg("p2p", i64, 0, 1, 1) + recv_cfg("barrier", u8)
        + message("reduce", 1, f32, reduce_op=4, root=1, count=2) + message("alltoall", 2, u8, count=5)
        + message("p2p", 3, i64, root=1, count=1) + message("barrier", 4, u8),
        # a header from the wrong rank, and a barrier
        "wrong_source": bytes([0x01]) + recv_cfg("barrier", u8) + recv_cfg("barrier", u8)
        + header("barrier", u8, seq=1, src=3),
        # late posting, one byte per write(): the socket buffer fills while nothing is posted
        "late_post_stalled": bytes([0x01 | 0x04 | 0x40]) + recv_cfg("allgather", u8, count=255) * 2
        + message("allgather", 1, u8, count=255) + message("allgather", 2, u8, count=255),
        # regression: an abort text cut inside a UTF-8 character by the 4096-byte limit (the sender's
        # "xxx...é" with é straddling byte 4096) became a UnicodeDecodeError in Python, not a PeerError
        "regress_abort_split_utf8": bytes([0x00]) + recv_cfg("barrier", u8) + abort_message("x" * 4095 + "é"),
        # an abort text that is not UTF-8 at all (a split character, a surrogate, 0xff)
        "abort_invalid_utf8": bytes([0x01]) + recv_cfg("allreduce", f32, 0, 0, 1) + recv_cfg("barrier", u8)
        + header(ABORT, dtype=0, nbytes=9, error_kind=MISMATCH) + b"caf\xc3 \xed\xa0\x80\xff",
        # regression (found by this target): a header with kind abort but a wrong magic, nothing posted;
        # progress() used to spin on the readable socket instead of sleeping
        "regress_spin_fake_abort": bytes([0x10]) + recv_cfg("barrier", u8)
        + header(ABORT, dtype=0, nbytes=4, magic=0xDEADBEEF) + b"more",
    }


def handshake():
    valid = hello()
    return {
        "valid": bytes([0x00]) + valid,
        "valid_stalled": bytes([0x04]) + valid,
        "valid_twice": bytes([0x08]) + valid,
        "valid_then_data": bytes([0x00]) + valid + header("barrier", 5),
        "xor_zero": bytes([0x01]) + bytes(44),
        "xor_token": bytes([0x01]) + bytes(24) + b"\x01" + bytes(19),
        "truncated": bytes([0x02, 20]),
        "truncated_stalled_then_valid": bytes([0x02 | 0x04 | 0x08, 43]),
        "sockets_differ": bytes([0x00]) + hello(lane=1, lanes=3),
        "sockets_differ_then_valid": bytes([0x08]) + hello(lane=0, lanes=2),
        "lane_out_of_range": bytes([0x00]) + hello(lane=1, lanes=1),
        "wrong_rank": bytes([0x00]) + hello(src=0),
        "ack_instead": bytes([0x00]) + hello(is_ack=1),
        "http_then_valid": bytes([0x08]) + b"GET / HTTP/1.0\r\n\r\n",
    }


def wire_header():
    ar = header("allreduce", 2, 0, 0, 17, 1048576, 0, 65536)
    return {
        "equal": bytes([0x01]) + ar + bytes(64),
        "count_differs": bytes([0x01]) + ar + bytes(32) + b"\x01" + bytes(31),
        "alltoall_counts": bytes([0x00]) + header("alltoall", 2, count=7, seq=3)
        + header("alltoall", 2, count=8, seq=3),
        "abort_vs_reduce": bytes([0x02]) + abort_message("x")[:64] + header("reduce", 3, 1, 2, 5, 10),
        "bad_enums": bytes([0x00]) + header(200, dtype=77, reduce_op=9, count=3, nbytes=12) + ar,
        "segment": bytes([0x00]) + header("broadcast", 4, root=1, count=100, offset=64, nbytes=36)
        + header("broadcast", 4, root=1, count=100, offset=64, nbytes=32),
    }


def to_current_version(data):
    """Every header in `data` (the magic, then a version) with WIRE_VERSION."""
    out = bytearray(data)
    for magic in (struct.pack("<I", WIRE_MAGIC), struct.pack("<I", HELLO_MAGIC)):
        i = out.find(magic)
        while i >= 0:
            if i + 6 <= len(out):
                out[i + 4:i + 6] = struct.pack("<H", WIRE_VERSION)
            i = out.find(magic, i + 4)
    return bytes(out)


def main():
    for target, seeds in [("fuzz_receive_path", receive_path()), ("fuzz_handshake", handshake()),
                          ("fuzz_wire_header", wire_header())]:
        d = os.path.join(HERE, "corpus", target)
        # Inputs the fuzzer found (regress*) stay, moved to the current wire version.
        kept = {}
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.startswith("regress"):
                    with open(os.path.join(d, name), "rb") as f:
                        kept[name] = to_current_version(f.read())
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        seeds = {**seeds, **kept}
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
