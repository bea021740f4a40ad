"""Why a stream ended: the one vocabulary that generation, the server and the store share.

Three layers each know part of the story, and each has its own words:

- the **generation** knows how the text ended: the model emitted
  end-of-sequence (``eos``), the text reached a stop sequence the client
  named (``stop_sequence``), it reached ``max_tokens``, was ``stopped``, or
  failed (``error``);
- the **server** knows *why* it stopped sending, the first sign that came:
  the ``stop_signal`` (EOF on the socket, a WebSocket CLOSE frame, a write that
  failed or timed out, the user's stop, the grace period, a reader too far
  behind, a shutdown...);
- the **store** keeps one word per answer, the stored *stop reason*, joining
  the two (see :func:`stop_reason_for`).

A reader is told one of them only: the stored stop reason, as the
``stop_reason`` of a stream's last event (``end``, ``error``, the WebSocket's
``done``). It is the word the reader finds again on the answer when it reads
the conversation back; two words side by side in one event would leave it to
guess which to believe. The generation's word and the signal stay in ``/log``.

Every name is defined here once; the modules import it.
"""

from __future__ import annotations

# -- How the generation ended (GenerationResult.stop_reason) -----------------
EOS = "eos"  # the model emitted end-of-sequence
MAX_TOKENS = "max_tokens"  # it reached max_tokens (also a stored reason, same word)
STOPPED = "stopped"  # its stop flag was set (also a stored reason, same word)
ERROR = "error"  # it raised (also a stored reason, same word)
STOP_SEQUENCE = "stop_sequence"  # the text reached one of the request's stop sequences

# -- How the server learned that it should stop sending (LogRecord.stop_signal)
EOF = "eof"  # a read returned b"": the client closed its end
CLOSE_FRAME = "close_frame"  # a WebSocket CLOSE frame arrived
STOP_MESSAGE = "stop_message"  # the WebSocket client sent {"stop": true}
WRITE_FAILED = "write_failed"  # a write raised: connection reset, broken pipe
WRITE_TIMEOUT = "write_timeout"  # a write could not drain within --write-timeout
# The kernel gave up on the connection: what was sent went unacknowledged for --tcp-user-timeout, or the
# keep-alive probes went unanswered (a client whose network vanished: no FIN, no RST ever comes).
CONNECTION_LOST = "connection_lost"
PROTOCOL_ERROR = "protocol_error"  # the WebSocket client broke RFC 6455
SERVER_SHUTDOWN = "server_shutdown"  # SIGTERM / SIGINT
CANCEL = "cancel"  # POST /generations/{id}/cancel
GRACE_EXPIRED = "grace_expired"  # a /generations answer went unread for --grace seconds
# The generation, --max-queued pieces ahead of its reader, waited --slow-reader-timeout seconds in all
# for it to take them (see streamlab/model/backlog.py), and stopped itself. Also a stored reason, same word.
SLOW_READER = "slow_reader"

# The signals that mean the reader is gone (rather than asked us to stop).
LEAVING_SIGNALS = frozenset({EOF, CLOSE_FRAME, WRITE_FAILED, WRITE_TIMEOUT, CONNECTION_LOST, PROTOCOL_ERROR,
                             GRACE_EXPIRED})

# -- Why an answer ended, as stored (Message.stop_reason) ---------------------
COMPLETED = "completed"  # the model ended by itself (it emitted end-of-sequence)
CLIENT_LEFT = "client_left"  # the reader disconnected
INTERRUPTED = "interrupted"  # the server stopped (shutdown, or found after a crash)
STOP_REASONS = (COMPLETED, MAX_TOKENS, CLIENT_LEFT, STOPPED, ERROR, INTERRUPTED, SLOW_READER)

# Only the model ending by itself makes an answer complete.
INCOMPLETE_REASONS = frozenset(STOP_REASONS) - {COMPLETED}

# A stop sequence ends the answer where the client asked it to end: complete.
_GENERATION_REASONS = {EOS: COMPLETED, STOP_SEQUENCE: COMPLETED, MAX_TOKENS: MAX_TOKENS, ERROR: ERROR}
# When the generation says "stopped", the signal says why.
_SIGNAL_REASONS: dict[str | None, str] = {
    **{signal: CLIENT_LEFT for signal in LEAVING_SIGNALS},  # the transport told us the reader is gone
    STOP_MESSAGE: STOPPED,  # the reader is still there and asked us to stop
    CANCEL: STOPPED,
    None: STOPPED,
    SERVER_SHUTDOWN: INTERRUPTED,  # nobody asked: the server is going away
    SLOW_READER: SLOW_READER,  # the reader is there, but so far behind that the server gave up on it
}


def stop_reason_for(generation_stop_reason: str, stop_signal: str | None) -> str:
    """Translate the generation layer's ending into the stored stop reason.

    ==================  ================================================  ===============
    generation          stop_signal                                       stored
    ==================  ================================================  ===============
    eos                 (any)                                             completed
    stop_sequence       (any)                                             completed
    max_tokens          (any)                                             max_tokens
    error               (any)                                             error
    stopped             eof, close_frame, write_failed, write_timeout,    client_left
                        grace_expired, protocol_error
    stopped             stop_message, cancel, None                        stopped
    stopped             server_shutdown                                   interrupted
    stopped             slow_reader                                       slow_reader
    server_shutdown     (any)                                             interrupted
    ==================  ================================================  ===============

    When the model ended by itself (eos, max_tokens) or failed, that is what
    happened to the *text*, whatever signal arrived at the same moment. An
    unknown name raises ``ValueError``: a new signal must be given a meaning
    here, not silently filed under the wrong reason.
    """
    if generation_stop_reason in _GENERATION_REASONS:
        return _GENERATION_REASONS[generation_stop_reason]
    if generation_stop_reason == SERVER_SHUTDOWN:
        return INTERRUPTED
    if generation_stop_reason == STOPPED:
        if stop_signal not in _SIGNAL_REASONS:
            raise ValueError(f"unknown stop signal {stop_signal!r}")
        return _SIGNAL_REASONS[stop_signal]
    raise ValueError(f"unknown generation stop reason {generation_stop_reason!r}")
