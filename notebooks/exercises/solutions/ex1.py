"""Exercise 1, a model answer: an incremental detokenizer with a prefix window.

Two offsets into the ids seen so far: ``read`` is where the text already sent
ends, ``prefix`` starts the few tokens of context before it. Each push decodes
only ``ids[prefix:]`` and compares it with the decoded context: what is longer
is new. A new text that ends in U+FFFD is an unfinished character, so the
piece waits for the next token (at most a few tokens: a model that really
writes U+FFFD must not stall the stream).
"""

REPLACEMENT = "\ufffd"
MAX_HOLD = 4  # a UTF-8 character is at most 4 bytes, and every token carries at least one


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids = []
        self.prefix = 0
        self.read = 0

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _new_text(self):
        context = self._decode(self.ids[self.prefix : self.read])
        window = self._decode(self.ids[self.prefix :])
        return context, window

    def push(self, token_id):
        self.ids.append(int(token_id))
        context, window = self._new_text()
        waiting = len(self.ids) - self.read
        if window.endswith(REPLACEMENT) and waiting < MAX_HOLD:
            return ""
        if len(window) <= len(context):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return window[len(context) :]

    def flush(self):
        context, window = self._new_text()
        self.prefix = self.read = len(self.ids)
        return window[len(context) :]
