"""Exercise 3, a model answer: encode a WebSocket frame, decode a masked one (RFC 6455 section 5.2)."""

import struct


def _xor(payload, key):
    return bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def encode_frame(opcode, payload, mask_key=None):
    head = bytearray([0x80 | opcode])  # FIN: this frame is a whole message
    mask_bit = 0x80 if mask_key is not None else 0
    n = len(payload)
    if n <= 125:
        head.append(mask_bit | n)
    elif n <= 0xFFFF:
        head.append(mask_bit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(mask_bit | 127)
        head += struct.pack("!Q", n)
    if mask_key is None:
        return bytes(head) + bytes(payload)
    return bytes(head) + bytes(mask_key) + _xor(payload, mask_key)


def decode_frame(data):
    fin = bool(data[0] & 0x80)
    opcode = data[0] & 0x0F
    masked = bool(data[1] & 0x80)
    n = data[1] & 0x7F
    offset = 2
    if n == 126:
        (n,) = struct.unpack_from("!H", data, 2)
        offset = 4
    elif n == 127:
        (n,) = struct.unpack_from("!Q", data, 2)
        offset = 10
    key = b""
    if masked:
        key = data[offset : offset + 4]
        offset += 4
    payload = bytes(data[offset : offset + n])
    if len(payload) < n:
        raise ValueError(f"incomplete frame: {len(payload)} of {n} payload bytes")
    return fin, opcode, _xor(payload, key) if masked else payload
