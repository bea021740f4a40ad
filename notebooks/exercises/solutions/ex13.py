"""Exercise 13, a model answer: follow an answer across replicas that share one log.

The reader's whole state is the id of the last event it kept: it goes out as
Last-Event-ID on every reconnect, whichever replica the balancer picks, and
an event at or before it is one the reader has (a replica that repeats the
entry at that id, or starts over). The ids are Redis stream entry ids,
"milliseconds-sequence", ordered as that pair of numbers. A 404 means the
replica never heard of the answer; one from every replica in a row means
none has it.
"""

ENDINGS = ("end", "error")
MAX_EMPTY = 3


def entry_order(entry_id):
    milliseconds, _, sequence = str(entry_id).partition("-")
    return int(milliseconds), int(sequence or 0)


def follow_replicas(connect, replicas=3):
    answer = []
    last_id = None
    empty = missing = 0
    while True:
        status, events = connect(last_id)
        if status == 204:
            return answer  # the server has nothing more after our last id
        if status == 404:
            missing += 1
            if missing >= replicas:
                raise LookupError(f"{missing} replicas in a row do not know this answer (last id {last_id})")
            continue
        missing = 0
        fresh = 0
        for event_id, kind, data in events:
            if kind not in ("text", *ENDINGS):
                continue  # a ping, a place in the queue: not part of the answer
            if last_id is not None and entry_order(event_id) <= entry_order(last_id):
                continue  # one we have: the replica sent it again
            answer.append((event_id, kind, data))
            last_id = event_id
            fresh += 1
            if kind in ENDINGS:
                return answer
        empty = 0 if fresh else empty + 1
        if empty >= MAX_EMPTY:
            raise ConnectionError(f"{MAX_EMPTY} connections in a row brought nothing after {last_id}")
