"""Exercise 8, a model answer: follow an answer across dropped connections.

The last id received is the reader's whole state: it goes out as
Last-Event-ID on every reconnect, and an id at or below it (a server that
started over) is one the reader already has. The answer is over at its end or
error event; a run of connections that bring nothing means the server is gone.
"""

ENDINGS = ("end", "error")
MAX_EMPTY = 3


def follow(connect):
    answer = []
    last_id = None
    empty = 0
    while True:
        events = connect(last_id)
        fresh = 0
        for event_id, kind, data in events:
            if kind not in ("text", *ENDINGS):
                continue  # a ping, or anything else that is not part of the answer
            if last_id is not None and int(event_id) <= int(last_id):
                continue  # already had it: the server started the answer over
            answer.append((event_id, kind, data))
            last_id = event_id
            fresh += 1
            if kind in ENDINGS:
                return answer
        empty = 0 if fresh else empty + 1
        if empty >= MAX_EMPTY:
            raise ConnectionError(f"{MAX_EMPTY} connections in a row brought nothing after event {last_id}")
