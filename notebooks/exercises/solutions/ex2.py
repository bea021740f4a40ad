"""Exercise 2, a model answer: an incremental Server-Sent Events parser.

Bytes arrive in arbitrary pieces, so everything that may be cut is kept for
the next feed: the bytes of a UTF-8 character (an incremental decoder), the
unfinished line, and a CR that may be the first half of CRLF.
"""

import codecs
import re

LINE_END = re.compile(r"\r\n|\r|\n")  # exactly the three an event stream knows


class SSEParser:
    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line = ""
        self._started = False  # a byte order mark counts only at the very start
        self._after_cr = False  # the last feed ended with CR: a LF now belongs to it
        self._data = []
        self._event = ""
        self._last_id = ""

    def feed(self, chunk):
        text = self._decoder.decode(chunk)
        if not text:
            return []
        if not self._started:
            self._started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        if self._after_cr:
            self._after_cr = False
            if text.startswith("\n"):
                text = text[1:]
        lines = LINE_END.split(self._line + text)
        self._line = lines.pop()
        self._after_cr = text.endswith("\r")
        events = []
        for line in lines:
            event = self._line_done(line)
            if event is not None:
                events.append(event)
        return events

    def _line_done(self, line):
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: a keep-alive, never an event
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None

    def _dispatch(self):
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return (event or "message", "\n".join(data), self._last_id)
