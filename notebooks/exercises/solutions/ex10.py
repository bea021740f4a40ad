"""Exercise 10, a model answer: read OpenAI's Chat Completions stream, to the last chunk.

Every chunk is looked at for what it may carry (choices, usage, an error),
never assumed to have a first choice: the usage chunk has none. Complete
means the answer said how it ended and the stream said it was over.
"""

import json

DONE = "[DONE]"


def read_chunks(datas):
    text, finish_reason, usage, done = [], None, None, False
    for data in datas:
        if data.strip() == DONE:
            done = True
            break
        chunk = json.loads(data)
        if chunk.get("error"):
            error = chunk["error"]
            raise RuntimeError(error.get("message", str(error)) if isinstance(error, dict) else str(error))
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                text.append(content)
            if choice.get("finish_reason"):
                finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            usage = chunk["usage"]
    return {"text": "".join(text), "finish_reason": finish_reason, "usage": usage,
            "complete": done and finish_reason is not None}
