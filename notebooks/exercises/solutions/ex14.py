"""Exercise 14, a model answer: when each stream of a page goes out, over HTTP/1.1 and over HTTP/2.

The streams are taken in the order they were asked for. Each origin has a
number of places (six connections over HTTP/1.1, the server's streams per
connection over HTTP/2), and a heap of the times its busy places free up. A
stream asked for when a place is free goes out at once; otherwise it takes
the earliest place to free. Taking them in order of asking is what makes
the line first come, first served: an earlier stream always took an earlier
place.
"""

import heapq

LIMITS = ("http/1.1", "h2")


def schedule(streams, protocol="http/1.1", per_origin=6, max_streams=128):
    if protocol not in LIMITS:
        raise ValueError(f"protocol {protocol!r}: say 'http/1.1' or 'h2'")
    limit = per_origin if protocol == "http/1.1" else max_streams
    order = sorted(range(len(streams)), key=lambda i: (streams[i]["asked"], i))
    frees = {}  # origin -> heap of the moments its busy places free up
    result = [None] * len(streams)
    for i in order:
        stream = streams[i]
        busy = frees.setdefault(stream["origin"], [])
        while busy and busy[0] <= stream["asked"]:
            heapq.heappop(busy)  # freed before this stream was asked for
        out = stream["asked"] if len(busy) < limit else heapq.heappop(busy)
        heapq.heappush(busy, out + stream["length"])
        result[i] = (out, out + stream["first"], out + stream["length"])
    return result
