"""Exercise 6, a model answer: keep a partial answer, and why it stopped."""

from streamlab.protocol.endings import STOP_REASONS


def save_answer(store, conversation_id, pieces, stop_reason):
    if stop_reason not in STOP_REASONS:
        # Refuse before writing anything: an unknown reason must not be filed as some other one.
        raise ValueError(f"unknown stop reason {stop_reason!r}; expected one of {STOP_REASONS}")
    writer = store.begin_answer(conversation_id)
    for count, piece in enumerate(pieces, start=1):
        writer.append(piece, count)
    return writer.finish(stop_reason).id
