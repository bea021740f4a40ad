"""Exercise 11, a model answer: a bounded hand-over that lets a slow reader go.

Two counters (handed, taken) give the queue; a wait is a start time, ended by
a take, and its length goes into the total. The stop looks at the total, the
current wait included, so short waits add up to the timeout as one long one would.
"""


class Handover:
    def __init__(self, max_queued, slow_reader_timeout):
        self.max_queued = max_queued
        self.slow_reader_timeout = slow_reader_timeout
        self.handed = self.taken = 0
        self.wait_began = None  # when the current wait for room began (None: not waiting)
        self.total = 0.0  # seconds of every ended wait
        self.stopped = False

    def waited(self, now):
        return self.total + (now - self.wait_began if self.wait_began is not None else 0.0)

    def _end_wait(self, now):
        if self.wait_began is not None:
            self.total += now - self.wait_began
            self.wait_began = None

    def offer(self, now):
        if self.stopped:
            return "stop"
        if self.handed - self.taken < self.max_queued:
            self._end_wait(now)
            self.handed += 1
            return "send"
        if self.wait_began is None:
            self.wait_began = now
        if self.waited(now) >= self.slow_reader_timeout:
            self.stopped = True
            return "stop"
        return "wait"

    def take(self, now):
        self.taken += 1
        self._end_wait(now)
