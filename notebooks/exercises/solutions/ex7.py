"""Exercise 7, a model answer: show the text at the reader's pace.

Each piece waits for two things, its arrival and the reader finishing the
piece before it; it is shown as soon as both have happened. The reader waits
only when the next piece had not arrived by the time they finished reading.
"""


def pace(arrivals, tokens, reading_tps):
    shown = []
    for i, arrived in enumerate(arrivals):
        if shown:
            ready = shown[-1] + tokens[i - 1] / reading_tps  # the previous piece has been read
            shown.append(max(arrived, ready))
        else:
            shown.append(arrived)
    return shown


def reader_waits(shown, tokens, reading_tps):
    finished = [at + n / reading_tps for at, n in zip(shown, tokens)]  # when each piece has been read
    return [max(0.0, at - done) for done, at in zip(finished, shown[1:])]
