"""Exercise 4, a model answer: watch the connection, and stop when the reader leaves.

While the answer streams, nothing else reads the socket. A read that returns
b"" is the client's FIN: it closed its end. A reset is the same news, told
rudely. Bytes that do arrive are not a goodbye (a keep-alive client may send
its next request early), so they are read and the watch goes on.
"""


async def watch(reader, stop):
    while True:
        try:
            data = await reader.read(65536)
        except ConnectionError:
            data = b""
        if not data:
            stop()
            return
